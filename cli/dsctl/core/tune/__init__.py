"""`dsctl tune`'s core: everything that decides, nothing that restarts or probes.

How the verbs (services.tune_live, services.tune for ``--simulate``) put it together, the I/O in brackets::

    slos   = slo.parse_slos(options.slo)                                  # --slo, repeatable / comma-separated
    space  = space.resolve_space(options.space or space.default_space(spec.engine), vllm_ascend=host_version,
                                 npus_per_instance=spec.npus_per_instance, params=spec.params,
                                 overrides=options.param)                 # --param, and the inventory's
    reason = screens.impossible(chip=..., model=..., prompt_tokens=..., output_tokens=..., slos=slos,
                                npus_per_instance=spec.npus_per_instance)  # refuse before any restart (exit 6)
    [writeback.check(inventory, spec.name)]   # --write-back: a write that could not succeed, refused here (exit 2)
    search = [tune_search.Search](space, slos, evaluator, search.SearchSettings(budget=..., slots=len(instances),
                           seed=..., objective=..., npus_per_instance=spec.npus_per_instance),
                           storage=[study_journal.journal_storage(run_dir / "study.journal")], resume=options.resume,
                           screen=screens.roofline_screen(...), baseline=space.baseline(spec.params, fields),
                           context={"versions": ..., "env": ...}, on_event=progress)
    result = search.run()                     # SearchResult: trials, best, counts, closest, stopped
                                              # (each trial decided by study.Study, read by analysis)
    [tune_artifacts.write_trials(result.trials, run_dir / "trials.jsonl")]
    [tune_artifacts.plot(result.trials, run_dir / "pareto.png", winner=result.best)]   # pareto.figure drawn
    [writeback.write_back(inventory, spec.name, result.best.params, fields=result.best.fields)]   # --write-back,
                                                     # once the winner is deployed and confirmed (services.tune_live)

The one tune driver (services.tune_driver) runs that for both verbs through its evaluator port.

The evaluator (one call per candidate, on the trial slot ``candidate.slot``): render ``candidate.params`` /
``candidate.fields`` with ``ServiceSpec.with_params``, restart that instance through deploy's health gate
(a failure -> ``Outcome(failure=search.classify_failure(log_tail))``), warm up, then
``rate_search.to_outcome(rate_search.search_rate(probe, slos, ...))`` with the probe's goodput bounds from
``slo.goodput_bounds_ms(slos)``, and ``agreement=quality.agreement(...).value`` when ``candidate.needs_quality``.
"""
