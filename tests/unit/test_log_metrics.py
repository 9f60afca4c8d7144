"""Log line format (hand-written expected lines) and the Prometheus registry (parsed back with prometheus_client's own
exposition parser)."""
from __future__ import annotations

import enum
import io
import logging
import os
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from ignisd import log as L
from ignisd.metrics import Metrics


@pytest.fixture(autouse=True)
def restore_logging():
    """Every test here reconfigures logging; put handlers and levels back afterwards."""
    root, ignis = logging.getLogger(), logging.getLogger("ignis")
    saved = (list(root.handlers), root.level, ignis.level)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    ignis.setLevel(saved[2])


@pytest.fixture
def logs():
    """setup_logging into a StringIO at debug level."""
    buf = io.StringIO()
    L.setup_logging("debug", stream=buf, journal=False)
    return buf


def test_format_fields_by_hand():
    assert L.format_fields(id="r1", prompt=12, cached=0, tier=None, ttft_ms=12.3456, tok_s=50.0, ok=True,
                           finish="stop") == "id=r1 prompt=12 cached=0 tier=- ttft_ms=12.346 tok_s=50 ok=true finish=stop"  # noqa: E501
    assert L.format_fields(text="hello world") == 'text="hello world"'
    assert L.format_fields(q='say "hi"') == r'q="say \"hi\""'
    assert L.format_fields(e="", eq="a=b", nl="a\nb", bs="a\\b") == r'e="" eq="a=b" nl="a\nb" bs="a\\b"'
    assert L.format_fields(path="/tmp/ignis-0/ignisd.sock", u="ünïcode") == "path=/tmp/ignis-0/ignisd.sock u=ünïcode"
    assert L.format_fields(stop=["a", "b"], n=[1, 2]) == r'stop="[\"a\",\"b\"]" n=[1,2]'
    assert L.format_fields(x=float("nan"), y=-0.0001, z=1e3) == "x=nan y=0 z=1000"

    class Finish(str, enum.Enum):
        STOP = "stop"
    assert L.format_fields(finish=Finish.STOP, p=Path("/a b/c"), t=(1, "x")) == r'finish=stop p="/a b/c" t="[1,\"x\"]"'


def test_lines_by_hand(logs):
    srv = L.get_logger("srv")
    srv.info("accepted", id="r1", conn=3)
    L.get_logger("sched").debug("admit", id="r1", pages=4)
    L.get_logger("cache").warning("no_slot", id="r2")
    L.get_logger("model").error("load_failed", path="/m/a b.gguf", reason="bad magic")
    srv.info("started")
    assert logs.getvalue() == (
        "INFO srv accepted id=r1 conn=3\n"
        "DEBUG sched admit id=r1 pages=4\n"
        "WARNING cache no_slot id=r2\n"
        'ERROR model load_failed path="/m/a b.gguf" reason="bad magic"\n'
        "INFO srv started\n")


def test_journal_priority_prefixes():
    buf = io.StringIO()
    handler = L.setup_logging("debug", stream=buf, journal=True)
    try:
        log = L.get_logger("srv")
        log.error("e", id="a")
        log.warning("w")
        log.info("i", n=1)
        log.debug("d")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("crashed", id="b")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = buf.getvalue().splitlines()
    assert lines[:5] == ["<3>ERROR srv e id=a", "<4>WARNING srv w", "<6>INFO srv i n=1", "<7>DEBUG srv d",
                         "<3>ERROR srv crashed id=b"]
    assert lines[5] == "<3>  Traceback (most recent call last):"
    assert all(line.startswith("<3>  ") for line in lines[5:]) and lines[-1] == "<3>  RuntimeError: boom"


def test_level_filtering_and_other_libraries():
    buf = io.StringIO()
    handler = L.setup_logging("warning", stream=buf, journal=False)
    try:
        L.get_logger("srv").info("hidden")
        L.get_logger("srv").warning("shown")
        logging.getLogger("asyncio").info("library chatter")
        logging.getLogger("asyncio").warning("Executing %s took %.3f seconds", "task", 0.5)
        assert not L.get_logger("srv").enabled("info") and L.get_logger("srv").enabled("error")
    finally:
        logging.getLogger().removeHandler(handler)
    assert buf.getvalue() == ('WARNING srv shown\n'
                              'WARNING asyncio log msg="Executing task took 0.500 seconds"\n')


def test_setup_logging_replaces_its_handler_and_rejects_bad_levels():
    a, b = io.StringIO(), io.StringIO()
    L.setup_logging("info", stream=a, journal=False)
    h = L.setup_logging("info", stream=b, journal=False)
    try:
        L.get_logger("srv").info("once")
    finally:
        logging.getLogger().removeHandler(h)
    assert a.getvalue() == "" and b.getvalue() == "INFO srv once\n"
    with pytest.raises(ValueError, match="trace"):
        L.setup_logging("trace")


def test_journal_stream_detection(tmp_path):
    f = tmp_path / "stream"
    f.write_text("")
    with open(f, "w") as fh:
        st = os.fstat(fh.fileno())
        assert L.journal_stream_active({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, fd=fh.fileno())
        assert not L.journal_stream_active({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, fd=fh.fileno())
        assert not L.journal_stream_active({}, fd=fh.fileno())
        assert not L.journal_stream_active({"JOURNAL_STREAM": "garbage"}, fd=fh.fileno())


# ------------------------------------------------------------------ metrics

def families(text: str) -> dict:
    """{sample name + sorted labels: value} from an exposition text."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_exposition_values():
    m = Metrics()
    m.set_pool(pages=100, used_pages=10, page_bytes=92160)
    m.lanes_busy.set(3)
    m.queue_depth.set(2)
    m.prefill_tokens_total.inc(500)
    m.prefill_tokens.inc(12)                    # alias of the same counter
    m.decode_tokens_total.inc(64)
    m.request_finished("stop")
    m.request_finished("stop")
    m.request_finished("cancelled")
    m.error_sent("bad_json")
    for s in (0.03, 0.2, 7.0):
        m.ttft_seconds.observe(s)
    m.inter_token_seconds.observe(0.004)
    text = m.render()
    assert isinstance(text, str)
    v = families(text)
    assert v[("ignis_kv_pool_pages", ())] == 100
    assert v[("ignis_kv_pool_used_pages", ())] == 10
    assert v[("ignis_kv_page_bytes", ())] == 92160
    assert v[("ignis_lanes_busy", ())] == 3 and v[("ignis_queue_depth", ())] == 2
    assert v[("ignis_prefill_tokens_total", ())] == 512 and v[("ignis_decode_tokens_total", ())] == 64
    assert v[("ignis_requests_total", (("finish_reason", "stop"),))] == 2
    assert v[("ignis_requests_total", (("finish_reason", "cancelled"),))] == 1
    assert v[("ignis_requests_total", (("finish_reason", "length"),))] == 0          # present from the start
    assert v[("ignis_errors_total", (("code", "bad_json"),))] == 1
    assert v[("ignis_errors_total", (("code", "busy"),))] == 0
    assert v[("ignis_ttft_seconds_bucket", (("le", "0.05"),))] == 1
    assert v[("ignis_ttft_seconds_bucket", (("le", "0.25"),))] == 2
    assert v[("ignis_ttft_seconds_bucket", (("le", "5.0"),))] == 2
    assert v[("ignis_ttft_seconds_bucket", (("le", "10.0"),))] == 3
    assert v[("ignis_ttft_seconds_bucket", (("le", "+Inf"),))] == 3
    assert v[("ignis_ttft_seconds_count", ())] == 3
    assert v[("ignis_ttft_seconds_sum", ())] == pytest.approx(7.23)
    assert v[("ignis_inter_token_seconds_bucket", (("le", "0.005"),))] == 1
    assert v[("ignis_inter_token_seconds_bucket", (("le", "0.0025"),))] == 0


def test_metrics_registries_are_private():
    a, b = Metrics(), Metrics()           # a global registry would refuse the second set of names
    a.decode_tokens.inc(5)
    assert families(b.render())[("ignis_decode_tokens_total", ())] == 0
    assert not any(name.startswith("ignis_") for name in REGISTRY._names_to_collectors)
    with pytest.raises(ValueError):
        a.request_finished("eos")
    with pytest.raises(ValueError):
        a.error_sent("oops")


# ------------------------------------------------------------------ journald lines read back

def test_journal_lines_parse_back(tmp_path):
    buf = io.StringIO()
    handler = L.setup_logging("info", stream=buf, journal=True)
    try:
        L.get_logger("srv").info("done", id="c1:r 1", prompt=1234, cached=1024, prefilled=210, generated=57,
                                 tier="device", kind="prefix", reason=None, ttft_ms="183.4", tok_s="41.9",
                                 finish="stop")
        L.get_logger("srv").warning("odd", stop=["a b", "c"], n=[1, 2], msg='say "hi"', empty="", ok=False)
    finally:
        logging.getLogger().removeHandler(handler)
    lines = buf.getvalue().splitlines()
    assert all(line.startswith(("<6>INFO ", "<4>WARNING ")) for line in lines)
    done = L.parse_line(lines[0])
    assert (done.priority, done.level, done.component, done.event) == (6, "INFO", "srv", "done")
    assert done.fields == {"id": "c1:r 1", "prompt": 1234, "cached": 1024, "prefilled": 210, "generated": 57,
                           "tier": "device", "kind": "prefix", "reason": None, "ttft_ms": 183.4, "tok_s": 41.9,
                           "finish": "stop"}
    odd = L.parse_line(lines[1])
    assert odd.priority == 4 and odd.fields == {"stop": ["a b", "c"], "n": [1, 2], "msg": 'say "hi"', "empty": "",
                                                "ok": False}
    assert L.parse_line("INFO srv listening socket=/run/ignis/ignisd.sock").priority is None
    for bad in ("INFO srv", 'INFO srv e a="unterminated', "INFO srv e novalue"):
        with pytest.raises(ValueError):
            L.parse_line(bad)


def test_stderr_message_prefix_follows_the_journal_stream(tmp_path):
    st = os.fstat(2)
    assert L.stderr_message("ignisd: x", env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}) == "<3>ignisd: x"
    assert L.stderr_message("ignisd: x", env={}) == "ignisd: x"


# ------------------------------------------------------------------ names llama.cpp and vLLM users look for

LLAMA_VLLM_EQUIVALENTS = {   # their name -> ignis's sample name
    "llamacpp:requests_processing / vllm:num_requests_running": "ignis_requests_running",
    "llamacpp:requests_deferred / vllm:num_requests_waiting": "ignis_requests_waiting",
    "llamacpp:kv_cache_usage_ratio / vllm:kv_cache_usage_perc": "ignis_kv_usage_ratio",
    "vllm:prefix_cache_queries_total": "ignis_prefix_cache_query_tokens_total",
    "vllm:prefix_cache_hits_total": "ignis_prefix_cache_hit_tokens_total",
    "llamacpp:prompt_tokens_total / vllm:prompt_tokens_total": "ignis_prompt_tokens_total",
    "llamacpp:tokens_predicted_total / vllm:generation_tokens_total": "ignis_generation_tokens_total",
    "vllm:time_to_first_token_seconds": "ignis_ttft_seconds_bucket",
    "vllm:inter_token_latency_seconds": "ignis_inter_token_seconds_bucket",
    "vllm:num_preemptions_total": "ignis_preemptions_total",
}


def test_the_llama_cpp_and_vllm_equivalents_and_their_values():
    from types import SimpleNamespace as NS
    m = Metrics()
    names = {name for name, _ in families(m.render())}
    assert [v for v in LLAMA_VLLM_EQUIVALENTS.values() if v not in names] == []
    m.set_pool(pages=200, used_pages=50, page_bytes=1000)
    m.lanes_busy.set(3)
    m.queue_depth.set(4)
    hit = NS(ttft_ms=120.0, prompt_tokens=1000, generated_tokens=20, cached_tokens=768,
             reuse=NS(reason=None))
    off = NS(ttft_ms=0.0, prompt_tokens=50, generated_tokens=0, cached_tokens=0, reuse=NS(reason="reuse_off"))
    m.request_done(hit)
    m.request_done(off)
    v = families(m.render())
    assert v[("ignis_requests_running", ())] == 3 and v[("ignis_requests_waiting", ())] == 4
    assert v[("ignis_kv_usage_ratio", ())] == 0.25
    assert v[("ignis_prefix_cache_query_tokens_total", ())] == 1000     # the reuse_off request looked up nothing
    assert v[("ignis_prefix_cache_hit_tokens_total", ())] == 768
    assert v[("ignis_prompt_tokens_total", ())] == 1050 and v[("ignis_generation_tokens_total", ())] == 20
    assert v[("ignis_ttft_seconds_count", ())] == 1                       # no token: no TTFT
    assert v[("ignis_preemptions_total", ())] == 0
    m.set_pool(0, 0, 0)
    assert families(m.render())[("ignis_kv_usage_ratio", ())] == 0


def test_the_http_listener_serves_the_registry_of_the_metrics_op():
    import urllib.request

    from ignisd.metrics import MetricsListener, parse_listen
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400) and parse_listen("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError):
        parse_listen("localhost")
    m = Metrics()
    m.decode_tokens.inc(7)
    listener = MetricsListener(m, "127.0.0.1:0")
    try:
        host, port = listener.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
    finally:
        listener.close()
    assert families(text) == families(m.render())
    assert families(text)[("ignis_decode_tokens_total", ())] == 7
