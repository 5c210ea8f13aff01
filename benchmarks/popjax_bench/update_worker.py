"""One process of a ``popjax bench update --processes P`` job (started by ``popjax_bench.update.run_job``).

    python -m popjax_bench.update_worker SPEC.json PROCESS_ID

Forces the spec's CPU devices, joins the job (``popjax.distributed``, coordinator on 127.0.0.1) when
it has several processes, then times the spec's points (``popjax_bench.update.job_main``). It stops
by itself when the process that started it is gone (killed, interrupted), so that no worker outlives
the study.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


def _watch_parent(parent: int, poll_s: float = 0.5) -> None:
    while True:
        if os.getppid() != parent:  # re-parented: the study is gone
            os._exit(3)
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    spec_path, process_id = (sys.argv[1:] if argv is None else argv)[:2]
    spec = json.loads(Path(spec_path).read_text())
    threading.Thread(target=_watch_parent, args=(spec["parent_pid"],), daemon=True).start()

    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", spec["devices_per_process"])  # before JAX starts
    from popjax import distributed

    if spec["processes"] > 1:
        distributed.initialize(distributed.JobPlace(spec["coordinator"], spec["processes"], int(process_id),
                                                    spec["timeout_s"]))
    from popjax_bench import update

    update.job_main(spec)
    print(f"process {jax.process_index()} of {jax.process_count()} done", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
