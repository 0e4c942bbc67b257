"""Ranks waiting for a long label scan under DDP (issue 60): they wait as long as the scan reports progress, however
long that is, and give up once nothing has moved for YOLO_DDP_TIMEOUT."""

import time
from pathlib import Path

import pytest

from tests.ddp_utils import spawn

TIMEOUT_MIN = "0.1"  # 6 s: the scan below runs twice as long


def _long_first(rank, world_size, out, beat):
    from utils import dist as du

    with du.torch_distributed_zero_first(rank):
        if rank == 0:
            for _ in range(12):
                time.sleep(1)
                if beat:
                    du.progress(64)
    (Path(out) / f"rank{rank}").write_text("through")


@pytest.mark.slow
@pytest.mark.ddp
def test_waiting_ranks_outlast_the_timeout_while_the_scan_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_DDP_TIMEOUT", TIMEOUT_MIN)
    spawn(_long_first, 2, str(tmp_path), True)
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["through"] * 2


@pytest.mark.slow
@pytest.mark.ddp
def test_waiting_ranks_give_up_when_nothing_moves(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_DDP_TIMEOUT", TIMEOUT_MIN)
    with pytest.raises(Exception, match="no rank's work went on"):
        spawn(_long_first, 2, str(tmp_path), False)
    assert not (tmp_path / "rank1").exists()
