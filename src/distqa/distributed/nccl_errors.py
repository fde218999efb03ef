"""NCCL's side of a lost peer: why, and what the CPU tests and the GPU benchmark check, is docs/FAULT_TOLERANCE.md,
"A lost peer" (its NCCL item).

NCCL's watchdog (a thread of ProcessGroupNCCL) finds a lost peer as an error the communicator reports (a peer's
connection reset: ncclRemoteError, ncclSystemError) or as the collective's timeout; under CleanUpOnly
(:func:`survive_nccl_errors`) it records it (ProcessGroupNCCL's ``ErrorType``, set in ``Watchdog::runLoop`` before it
aborts), which :func:`wait_for_collectives` asks for before each optimizer update. The wait's cost on a healthy step
is the "save_on_peer_loss off" row of ``bench/gpu_settings.py`` (target: at most 1 %).
"""

from __future__ import annotations

import logging
import os
import time

import torch
import torch.distributed as dist

from distqa.distributed.runtime import Runtime

log = logging.getLogger(__name__)

ERROR_HANDLING_VARIABLE = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
CLEAN_UP_ONLY = "2"
"""ProcessGroupNCCL's ErrorHandlingMode CleanUpOnly: abort the communicators on an error, keep the process."""
WATCHDOG_GRACE_S = 60.0
"""How much longer than the collectives' own timeout :func:`wait_for_collectives` waits: the watchdog, which aborts a
stalled collective at ``dist_timeout_s``, acts first; this bound only ends a wait the watchdog never ends."""
POLL_S = 1e-4


class NCCLCollectiveError(RuntimeError):
    """A collective failed under NCCL before an optimizer update (its message names the communicator's abort, which
    :data:`distqa.training.peer_loss.PEER_GONE` knows as a lost peer)."""


def survive_nccl_errors() -> None:
    """Have NCCL's watchdog abort a failed collective's communicator without ending the process. Before the NCCL
    process group exists: ProcessGroupNCCL reads the variable in its constructor."""
    given = os.environ.get(ERROR_HANDLING_VARIABLE)
    if given not in (None, CLEAN_UP_ONLY):
        log.debug("%s=%s replaced by %s (CleanUpOnly), so that a survivor of a lost peer can save its last step "
                 "(save_on_peer_loss)", ERROR_HANDLING_VARIABLE, given, CLEAN_UP_ONLY)
    os.environ[ERROR_HANDLING_VARIABLE] = CLEAN_UP_ONLY


def reported_error(group: dist.ProcessGroup | None = None) -> str | None:
    """The error NCCL's watchdog recorded on ``group`` (default: the default group): 'SUCCESS', 'TIMEOUT',
    'COMM_ERROR' or 'REMOTE_ERROR'; None when this torch's ProcessGroupNCCL does not report one."""
    group = group or dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cuda", torch.cuda.current_device()))
    get_error = getattr(backend, "get_error", None)
    if get_error is None:
        return None
    return get_error().name


def wait_for_collectives(runtime: Runtime, timeout_s: float, step: int) -> None:
    """Return once the GPU has run everything queued so far and NCCL reported no error; raise
    :class:`NCCLCollectiveError` otherwise (then optimizer step ``step + 1``'s update must not be queued). Does
    nothing unless the backend is NCCL."""
    if runtime.backend != "nccl":
        return
    finished = torch.cuda.Event()
    finished.record()
    deadline = time.monotonic() + timeout_s + WATCHDOG_GRACE_S
    while not finished.query():
        if time.monotonic() > deadline:
            raise NCCLCollectiveError(
                f"NCCL communicator was aborted: the collectives before optimizer step {step + 1}'s update did not "
                f"finish within {timeout_s + WATCHDOG_GRACE_S:g} s and NCCL's watchdog did not end them")
        time.sleep(POLL_S)
    error = reported_error()
    if error not in ("SUCCESS", None):
        raise NCCLCollectiveError(f"NCCL communicator was aborted ({error}) before optimizer step {step + 1}'s "
                                  "update: a peer is gone or stalled")
