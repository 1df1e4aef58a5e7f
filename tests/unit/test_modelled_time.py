"""A time-scaled engine's records in modelled time (dsctl.services.probe.modelled_record): with the engine's own
stamps only its part is scaled; without them every instant is."""

from __future__ import annotations

import math

import pytest

from dsctl.core.load import probe_metrics
from dsctl.core.load.probe_metrics import RequestRecord
from dsctl.services.probe import modelled_record

SCALE = 0.05


def record(stamps):
    # released at 10.000, sent 1 ms late; first byte 4 ms after sending, of which the engine's own part was 2.5 ms;
    # the second 1 ms later (engine: 0.8 ms later); the stream ends 0.2 ms after the last message
    return RequestRecord("r", scheduled=10.0, sent=10.001, chunk_times=[10.005, 10.006], token_messages=2,
                         output_tokens=2, status=200, end=10.0062, engine_elapsed=stamps)


def test_with_stamps_only_the_engines_part_is_scaled():
    modelled = modelled_record(record([0.0025, 0.0033]), origin=0.0, scale=SCALE)
    assert modelled.scheduled == pytest.approx(10.0 / SCALE)
    assert modelled.sent - modelled.scheduled == pytest.approx(0.001)  # the client's lag, once
    # TTFT: 2.5 ms of engine time scaled (50 ms) + 1.5 ms of wall overhead once
    assert modelled.ttft == pytest.approx(0.0025 / SCALE + 0.0015)
    # the gap between messages: 0.8 ms of engine time scaled (16 ms) + the 0.2 ms the engine's part does not cover
    assert modelled.chunk_times[1] - modelled.chunk_times[0] == pytest.approx(0.0008 / SCALE + 0.0002)
    assert modelled.end - modelled.chunk_times[-1] == pytest.approx(0.0002)
    overhead = probe_metrics.stamped_overhead([record([0.0025, 0.0033])])
    assert overhead == {"requests": 1, "wall_overhead_ms_median": 1.5, "wall_overhead_ms_p90": 1.5}


@pytest.mark.parametrize("stamps", [None, [], [0.0025], [math.nan, 0.0033]])
def test_without_a_stamp_on_every_message_every_instant_is_scaled(stamps):
    modelled = modelled_record(record(stamps), origin=0.0, scale=SCALE)
    assert modelled.ttft == pytest.approx(0.004 / SCALE)  # the whole wall interval, scaled
    assert modelled.sent == pytest.approx(10.001 / SCALE)
    assert probe_metrics.stamped_overhead([record(stamps)]) is None


def test_at_scale_one_the_record_is_left_as_it_is():
    rec = record([0.0025, 0.0033])
    assert modelled_record(rec, origin=0.0, scale=1.0) is rec
