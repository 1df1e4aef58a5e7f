"""The real ports: ansible-playbook through dsctl.adapters.ansible_run, HTTP through dsctl.adapters.probe_client."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsctl.adapters import ansible_run
from dsctl.adapters.inventory import VaultOptions
from dsctl.adapters.probe_client import Load, Preflight, ProbeClient, ProbeError, ProbeRun, RunResult, Target, Timeouts
from dsctl.errors import DsctlError, UsageError
from dsctl.services.ports import BodyMaker, FinishHook, ProgressSink

MODELS_TIMEOUT_S = 10.0
TOKENIZE_PATH = "/tokenize"  # vLLM's token count of a prompt or of chat messages (its serving_tokenization)
# What dsctl's emulated engine adds to vLLM's /version (dsctl.engine.server); no other server sends it.
ENGINE_TIME_SCALE_KEY = "emulated_time_scale"


@dataclass(frozen=True)
class AnsiblePlaybookRunner:
    """`PlaybookRunner` over dsctl's own ansible-playbook; ``timeout`` bounds every run (None: unbounded)."""

    timeout: float | None = None

    def run(self, playbook: str, inventory: Path, *, limit: str | None = None, check: bool = False,
            diff: bool = False, tags: str | None = None, forks: int | None = None,
            extra_vars: Mapping[str, Any] | None = None, vault: VaultOptions | None = None,
            on_event: ProgressSink | None = None, artifacts_dir: Path | None = None,
            stop: threading.Event | None = None) -> ansible_run.PlaybookRun:
        return ansible_run.run_playbook(playbook, inventory, limit=limit, check=check, diff=diff, tags=tags,
                                        forks=forks, extra_vars=dict(extra_vars) if extra_vars else None,
                                        vault=vault, on_event=on_event, artifacts_dir=artifacts_dir,
                                        timeout=self.timeout, stop=stop)


async def _resolve_model(client: ProbeClient, model: str | None) -> str:
    try:
        status, doc = await client.get_json("/v1/models", timeout=min(MODELS_TIMEOUT_S, client.timeouts.total))
    except ProbeError as exc:
        raise DsctlError(str(exc)) from None
    models = doc.get("data") if isinstance(doc, dict) else None
    if model:
        served = [str(m["id"]) for m in models if isinstance(m, dict) and m.get("id")] \
            if status == 200 and isinstance(models, list) else []
        if served and model not in served:
            # vLLM answers 404 for a model it does not serve, but llama.cpp's server and some gateways serve
            # whatever name is asked: the probe would measure a model the user did not name
            shown = ", ".join(served[:8]) + (f", ... ({len(served)} models)" if len(served) > 8 else "")
            raise UsageError(f"--model {model}: {client.target.url}/v1/models lists {shown}; pass one of them "
                             "(or leave --model out for the first)")
        return model
    if status != 200 or not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise DsctlError(f"{client.target.url}/v1/models answered HTTP {status} without a model list; "
                         "pass --model NAME")
    return str(models[0].get("id"))


@dataclass(frozen=True)
class HttpProber:
    """`Prober` over dsctl's streaming OpenAI client (one asyncio loop per probe)."""

    def prompt_token_counts(self, target: Target, *, api_key: str | None, timeouts: Timeouts,
                            bodies: list[bytes]) -> tuple[list[int] | None, str]:
        async def main() -> tuple[list[int] | None, str]:
            counts: list[int] = []
            async with ProbeClient(target, api_key=api_key, timeouts=timeouts) as client:
                for body in bodies:
                    try:
                        status, doc = await client.post_json(TOKENIZE_PATH, body)
                    except ProbeError as exc:
                        return None, str(exc)
                    count = doc.get("count") if status == 200 and isinstance(doc, dict) else None
                    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
                        return None, (f"{target.url}{TOKENIZE_PATH} answered HTTP {status}" if status != 200 else
                                      f"{target.url}{TOKENIZE_PATH} answered without a token count")
                    counts.append(count)
            return counts, ""

        return asyncio.run(main())

    def engine_time_scale(self, target: Target, *, api_key: str | None, timeouts: Timeouts) -> float | None:
        async def main() -> float | None:
            async with ProbeClient(target, api_key=api_key, timeouts=timeouts) as client:
                try:
                    status, doc = await client.get_json("/version", timeout=min(MODELS_TIMEOUT_S,
                                                                                 client.timeouts.total))
                except ProbeError:
                    return None
            value = doc.get(ENGINE_TIME_SCALE_KEY) if status == 200 and isinstance(doc, dict) else None
            return float(value) if isinstance(value, int | float) and 0 < value < float("inf") else None

        return asyncio.run(main())

    def probe(self, target: Target, *, path: str, model: str | None, api_key: str | None,
              request_id_header: str | None, timeouts: Timeouts,
              load: Load, warmup: int, body: BodyMaker, backstop: float, on_model: Callable[[str], None],
              on_finish: FinishHook, lag_samples: list[float] | None = None, keep_text: bool = False,
              preflight: Callable[[str], bytes] | None = None) -> tuple[str, RunResult]:
        async def main() -> tuple[str, RunResult]:
            async with ProbeClient(target, api_key=api_key, timeouts=timeouts, lag_samples=lag_samples,
                                   request_id_header=request_id_header, keep_text=keep_text) as client:
                resolved = await _resolve_model(client, model)
                on_model(resolved)
                answer = None
                if preflight is not None:
                    try:
                        answer = Preflight(*await client.post_json(path, preflight(resolved)))
                    except ProbeError as exc:  # the load that follows says whether the server is usable
                        answer = Preflight(None, None, str(exc))

                def finished(rec) -> None:
                    reason = on_finish(rec)
                    if reason:
                        run.stop(reason)

                run = ProbeRun(client, path, lambda index: body(resolved, index), load, warmup=warmup,
                               on_finish=finished)
                result = await run.run(backstop=backstop)
                result.preflight = answer
                return resolved, result

        return asyncio.run(main())
