"""NCCL's side of a lost peer (docs/FAULT_TOLERANCE.md, "A lost peer").

Under gloo a collective whose peer is gone raises in Python at once, and the trainer knows which step it is at. Under
NCCL nothing raises where the collective is called: its kernel waits on the GPU while the host queues the next
kernels, and NCCL's watchdog (a thread of ProcessGroupNCCL) finds the failure later, as an error the communicator
reports (a peer's connection reset: ncclRemoteError, ncclSystemError) or as the collective's timeout
(``dist_timeout_s``). What the watchdog does then is ``TORCH_NCCL_ASYNC_ERROR_HANDLING``'s: by default (3,
SkipCleanUp) it ends the process, so no survivor can save anything.

With ``save_on_peer_loss`` the runtime sets it to 2 (CleanUpOnly, :func:`survive_nccl_errors`): the watchdog records
the error (ProcessGroupNCCL's ``ErrorType``: TIMEOUT, COMM_ERROR, REMOTE_ERROR, set in ``Watchdog::runLoop`` before it
aborts) and aborts the communicators, and the process lives on. An aborted collective's kernel ends on partial data,
so an optimizer update queued behind it would corrupt the weights. Hence the trainer calls
:func:`wait_for_collectives` before each update: it waits until the GPU has run everything queued so far (the
gradients' all-reduce included), then asks the process group whether NCCL reported an error, and only then does the
trainer queue the update. A survivor's weights are therefore always those of its last complete optimizer step, which
:mod:`distqa.training.peer_loss` saves.

The price on a healthy step: once per optimizer step the host waits for the GPU before it queues the update, where it
would otherwise run ahead. The "save_on_peer_loss off" row of ``bench/gpu_settings.py`` (``bench/gpu.sh``) measures
it against the same step without the wait (target: at most 1 %), and records whether this torch's ProcessGroupNCCL
reports its error state (``get_error``) at all; without it a survivor under NCCL saves nothing and says so. The logic
is tested on CPU (tests/unit/test_peer_loss.py); the GPU behaviour only by that benchmark part.
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
