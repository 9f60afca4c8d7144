"""Test seams: a daemon started with this folder on PYTHONPATH and
- IGNIS_TEST_WRITE_DELAY_S=<seconds> waits that long before each KV-disk file write (cache/disk_io.write_file), as a
  slow or busy disk would; the write itself is real;
- IGNIS_TEST_PREFILL_DELAY_S=<seconds> waits that long before each round that prefills (Runner.execute of a plan with
  prefill tokens), as a long prompt on a slow machine would; the round itself is real."""
import os
import time

if os.environ.get("IGNIS_TEST_WRITE_DELAY_S"):
    import ignisd.cache.disk_io as _disk_io

    _write_file = _disk_io.write_file

    def _slow_write_file(*args, **kwargs):
        time.sleep(float(os.environ["IGNIS_TEST_WRITE_DELAY_S"]))
        return _write_file(*args, **kwargs)

    _disk_io.write_file = _slow_write_file

if os.environ.get("IGNIS_TEST_PREFILL_DELAY_S"):
    import ignisd.runner as _runner

    _execute = _runner.Runner.execute

    def _slow_execute(self, plan):
        if plan.prefill_tokens:
            time.sleep(float(os.environ["IGNIS_TEST_PREFILL_DELAY_S"]))
        return _execute(self, plan)

    _runner.Runner.execute = _slow_execute
