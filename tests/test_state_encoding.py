"""The straggler and congestion detectors write their state with orjson's own dataclass encoder: the bytes must stay
those of the dataclasses.asdict form they replaced (states stored by earlier releases are read back by the same
decode_state), and every state must come back equal. Checked on the states a congested link and a straggling rank
really go through, at every flush."""

from __future__ import annotations

from dataclasses import asdict

import orjson
import pytest

from clocktower.streams.detectors.congestion import CongestionDetector
from clocktower.streams.detectors.straggler import Job, StragglerDetector
from tests.test_congestion import MS, T0, US, row
from tests.test_detectors import Fed
from tests.test_straggler import bd


def _asdict_form(value: object) -> object:
    if isinstance(value, Job):
        return {"ranks": {r: asdict(x) for r, x in value.ranks.items()}, "recent": value.recent,
                "pending": value.pending, "done": value.done, "size": value.size}
    if isinstance(value, dict) and "link" in value:
        return {**value, "link": asdict(value["link"])}
    return list(value)


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Wraps both detectors' encode_state: each state is compared and round-tripped; returns the states seen."""
    seen: list[object] = []
    for cls in (StragglerDetector, CongestionDetector):
        def encode(self, value, _orig=cls.encode_state):  # noqa: ANN001, ANN202
            data = _orig(self, value)
            assert data == orjson.dumps(_asdict_form(value))
            back = self.decode_state(data)
            assert (tuple(value) if isinstance(value, list) else value) == back
            seen.append(value)
            return data
        monkeypatch.setattr(cls, "encode_state", encode)
    return seen


def test_a_straggling_rank_s_job_state_encodes_as_asdict_did(checked: list[object]) -> None:
    det = Fed(StragglerDetector())
    for it in range(30):
        for r in range(16):
            det(bd(r, it, 200 * (1.5 if r == 5 and 12 <= it < 20 else 1.0) * (1 + 0.01 * ((r * 7 + it * 3) % 5 - 2)),
                   world_size=16))
    jobs = [v for v in checked if isinstance(v, Job)]
    assert len(jobs) >= 400 and any(x.track.straggling for j in jobs for x in j.ranks.values())


def test_a_congested_link_s_state_encodes_as_asdict_did(checked: list[object]) -> None:
    det = Fed(CongestionDetector())
    for i in range(300):
        det(row(T0 + i * MS, (200 * US if 100 <= i < 200 else 5 * US), seq=i))
    links = [v for v in checked if isinstance(v, dict) and "link" in v]
    assert len(links) >= 250 and any(v.get("open") for v in links)
