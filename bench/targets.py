"""The PASS/MISS line of a benchmark's target, without torch: bench/gpu_report.py prints the GPU goals from the
parts' JSON files and needs no more than this (harness.py, which re-exports it, imports torch and distqa)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One ratio and the bound it must meet."""

    name: str
    value: float
    bound: float
    at_most: bool
    """True: the value must be <= bound (a time ratio); False: >= bound (a throughput ratio)."""

    @property
    def met(self) -> bool:
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    def line(self) -> str:
        verdict, relation = "PASS" if self.met else "MISS", "<=" if self.at_most else ">="
        return f"{verdict}  {self.name:<52} {self.value:8.3f}  (target {relation} {self.bound:g})"
