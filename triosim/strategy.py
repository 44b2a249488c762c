"""What parallelism to simulate and how: the case number and the options that shape its DAG."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

CASE_NAMES = {
    0: "single-GPU training",
    1: "data parallel",
    2: "distributed data parallel (DDP)",
    3: "tensor parallel",
    4: "pipeline parallel",
}


@dataclass(frozen=True)
class Strategy:
    """The ``-case`` and every option a graph builder reads.

    ``micro_batch_size`` None means one micro-batch of the whole (simulated) batch.
    ``collective_detail``: ``expanded`` (one transfer per ring step), ``macro`` (one task holding
    the ring's links for the closed-form time) or ``auto`` (expanded while the graph is small).
    """

    case: int = 0
    micro_batch_size: int | None = None
    bucket_mb: float = 25.0
    schedule: str = "gpipe"
    partition: str = "optimal"
    initial_placement: str = "gpu"
    reference_compat: bool = False
    collective_detail: str = "auto"
    virtual_stages: int = 1

    def validate(self) -> None:
        if self.case not in CASE_NAMES:
            raise ConfigError(f"-case must be one of 0..4, got {self.case}")
        if self.micro_batch_size is not None and self.micro_batch_size <= 0:
            raise ConfigError(f"-micro-batch-size must be a positive integer, got {self.micro_batch_size}")
        if self.bucket_mb <= 0:
            raise ConfigError(f"--bucket-mb must be > 0, got {self.bucket_mb}")
        if self.schedule not in ("gpipe", "1f1b", "interleaved"):
            raise ConfigError(f"--schedule must be gpipe, 1f1b or interleaved, got {self.schedule!r}")
        if self.partition not in ("optimal", "time", "count"):
            raise ConfigError(f"--partition must be optimal, time or count, got {self.partition!r}")
        if self.schedule == "interleaved":
            if self.virtual_stages < 2:
                raise ConfigError(f"--schedule interleaved needs --virtual-stages 2 or more, got {self.virtual_stages}")
            if self.reference_compat:
                raise ConfigError("--schedule interleaved has no --reference-compat form (the original runs GPipe)")
        elif self.virtual_stages != 1:
            raise ConfigError(f"--virtual-stages {self.virtual_stages} needs --schedule interleaved "
                              f"(got --schedule {self.schedule})")
        if self.initial_placement not in ("gpu", "remote"):
            raise ConfigError(f"--initial-placement must be gpu or remote, got {self.initial_placement!r}")
        if self.collective_detail not in ("auto", "expanded", "macro"):
            raise ConfigError(
                f"--collective-detail must be auto, expanded or macro, got {self.collective_detail!r}"
            )

    @property
    def name(self) -> str:
        return CASE_NAMES.get(self.case, f"case {self.case}")
