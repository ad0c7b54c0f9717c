"""`--act-bits 8` (int8 activations, docs/engine.md, Numerics) through the
whole pipeline: `zinfer serve` passes it to its worker, whose log says so,
and 4 concurrent greedy requests get exactly the tokens `zinfer generate
--act-bits 8` gives for the same prompts. (Its accuracy against the float64
reference: tests/e2e/test_logits.py.)
"""
import sys

from conftest import REPO, ids_arg, last_json, run_all, serve_process

sys.path.insert(0, str(REPO / "clients" / "python"))
from zinfer_client import Client  # noqa: E402


def test_served_int8_activations_equal_cli(zinfer_bin, model_path, tmp_path, prompts, run_zinfer):
    chosen = [p["ids"] for _, p in sorted(prompts.items())][:4]
    sp = {"max_new_tokens": 24, "ignore_eos": True}
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log", "--threads-per-worker", 2,
                       "--act-bits", 8) as srv:
        with Client(srv.addr, timeout_s=300) as c:
            served = run_all(c, chosen, sp)
        log = srv.log()
    assert "8-bit activations" in log, log
    for ids, got in zip(chosen, served):
        r = run_zinfer("generate", "--model", model_path, "--prompt-ids", ids_arg(ids),
                       "--max-tokens", 24, "--ignore-eos", "--act-bits", 8, "--json")
        assert r.returncode == 0, r.stderr
        assert got == last_json(r.stdout)["token_ids"], ids
