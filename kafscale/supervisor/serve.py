"""``kafscale serve``: prepare the run's private directory, then run the broker.

This module must not import prometheus-client (directly or through the broker's modules): it
picks its multiprocess storage when first imported, so ``PROMETHEUS_MULTIPROC_DIR`` has to point
into the runtime directory before ``kafscale.supervisor.broker`` is imported.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

from kafscale.config import Config


def serve(config: Config) -> int:
    """Run the broker until SIGTERM/SIGINT; the exit status of ``kafscale serve``."""
    run_id = uuid.uuid4().hex[:10]
    runtime_dir = tempfile.mkdtemp(prefix=f"kafscale-{run_id}-")
    try:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(runtime_dir, "metrics")
        os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        from kafscale.supervisor.broker import run_broker

        return run_broker(config, run_id, runtime_dir)
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
