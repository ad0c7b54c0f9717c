"""Rerankers (llama.cpp's `rank` pooling) through `zinfer serve`: the
msgpack `embed` op with a `query`, and `POST /v1/rerank` / `/rerank`.

Two random-weight files, one server each:
- a cross-encoder: `bert` (gguf_files.encoder_tensors, bert-bge vocabulary)
  with a classification head, `cls.weight`/`cls.bias` (dense, tanh) and
  `cls.output.weight`/`.bias` (one output), pooling_type 4; the pair is
  [CLS] query [SEP] document (llama.cpp's format_prompt_rerank for a
  WordPiece vocabulary), the first token pooled;
- a causal reranker shaped like Qwen3-Reranker: `qwen3` with tied
  embeddings, `cls.output.weight` of two rows, labels ["yes", "no"] and the
  `tokenizer.chat_template.rerank` that llama.cpp's converter writes; the
  last token pooled, softmax over the labels, the score P(yes).

Per document, zinfer's score is compared with the float64 reference of the
same graph (test_embed_bert.reference; scripts/ref/numpy_llama.py) and with
llama.cpp's (llama-cpp-python, rank pooling, the same token ids), and the
order of the documents is the reference's for both engines. zinfer
attends over the pass's own float32 K/V for both (span_attention;
zi_batch.f32_attn runs the decoder's pairs whole, causally), so its scores
are far closer to the reference: measured largest error over the
documents, cross-encoder 1.1e-6 vs llama.cpp's 2.0e-3 (its GELU goes
through an fp16 table), causal reranker 1.8e-7 vs 1.9e-4 (llama.cpp reads
float16 V back from its cache). The pair's
token ids are checked too: zinfer's count for each pair equals llama.cpp's
tokenization of the same pair.

HTTP: the Jina / Cohere shape (results best first, top_n,
return_documents), equal to the msgpack op's scores, and bad inputs each a
400 naming the field; a model without a head refuses rank.
"""

import http.client
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ZINFER_BIN, ZINFER_MODEL, free_port, serve_process, wait_http
from gguf_files import encoder_tensors, tokenizer_rows, write_gguf
from zinfer_client import Client, ZinferError

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
from test_embed_bert import BGE, EPS, N_HEAD, reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "ref"))
import numpy_llama  # noqa: E402

VENDOR = BGE.parent
QWEN_VOCAB = VENDOR / "ggml-vocab-qwen2.gguf"
QWEN_RERANK = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")

QUERY = "What do cats do all day?"
DOCS = ["Cats sleep for most of the day and hunt at dusk.",
        "The stock market closed higher on Friday.",
        "A small robot was built in 1990 to sort letters.",
        "My neighbour's cat likes to sit on the warm roof.",
        "Quantum physics is hard to explain to children.",
        "Our team changed the way we think about time.",
        "This recipe needs two eggs and a cup of flour.",
        "The old train leaves the station at noon."]


def write_bert_reranker(path, seed=5, n_embd=64, labels=None):
    rows, n_vocab = tokenizer_rows(BGE)
    rng = np.random.default_rng(seed)
    t = encoder_tensors(rng, "bert", n_vocab, n_embd, 2 * n_embd, 2, 512)
    t["cls.weight"] = (rng.standard_normal((n_embd, n_embd)) / np.sqrt(n_embd)).astype(np.float32)
    t["cls.bias"] = (0.1 * rng.standard_normal(n_embd)).astype(np.float32)
    t["cls.output.weight"] = rng.standard_normal((1, n_embd)).astype(np.float32)
    t["cls.output.bias"] = np.array([0.25], np.float32)
    hp = {"context_length": 512, "embedding_length": n_embd, "feed_forward_length": 2 * n_embd,
          "block_count": 2, "attention.head_count": N_HEAD,
          "attention.layer_norm_epsilon": float(EPS), "pooling_type": 4}
    w_rows = list(rows) + [("bert.attention.causal", False, gguf.GGUFValueType.BOOL, None)]
    if labels is not None:
        w_rows.append(("bert.classifier.output_labels", labels, gguf.GGUFValueType.ARRAY,
                       gguf.GGUFValueType.STRING))
    if not any(r[0] == "tokenizer.ggml.token_type_count" for r in rows):
        w_rows.append(("tokenizer.ggml.token_type_count", 2, gguf.GGUFValueType.UINT32, None))
    write_gguf(path, "bert", w_rows, hp, {k: (v, None) for k, v in t.items()})
    return path, {k: v.astype(np.float64) for k, v in t.items()}


def write_qwen3_reranker(path, seed=7, d=64, n_head=4, n_kv=2, hd=16, ff=128, layers=2):
    rows, n_vocab = tokenizer_rows(QWEN_VOCAB)
    rng = np.random.default_rng(seed)

    def mat(r, c, s=None):
        return (rng.standard_normal((r, c)) * (s or 1 / np.sqrt(c))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": mat(n_vocab, d, 0.3), "output_norm.weight": norm(d),
         "cls.output.weight": mat(2, d, 0.3)}
    for i in range(layers):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": norm(d), b + "ffn_norm.weight": norm(d),
                  b + "attn_q.weight": mat(n_head * hd, d), b + "attn_k.weight": mat(n_kv * hd, d),
                  b + "attn_v.weight": mat(n_kv * hd, d),
                  b + "attn_output.weight": mat(d, n_head * hd),
                  b + "attn_q_norm.weight": norm(hd), b + "attn_k_norm.weight": norm(hd),
                  b + "ffn_gate.weight": mat(ff, d), b + "ffn_up.weight": mat(ff, d),
                  b + "ffn_down.weight": mat(d, ff)})
    hp = {"context_length": 512, "embedding_length": d, "feed_forward_length": ff,
          "block_count": layers, "attention.head_count": n_head,
          "attention.head_count_kv": n_kv, "attention.key_length": hd,
          "attention.value_length": hd, "rope.freq_base": 1000000.0,
          "attention.layer_norm_rms_epsilon": 1e-6, "pooling_type": 4}
    w_rows = list(rows) + [
        ("qwen3.classifier.output_labels", ["yes", "no"], gguf.GGUFValueType.ARRAY,
         gguf.GGUFValueType.STRING),
        ("tokenizer.chat_template.rerank", QWEN_RERANK, gguf.GGUFValueType.STRING, None)]
    write_gguf(path, "qwen3", w_rows, hp, {k: (v, None) for k, v in t.items()})
    return path


class Http:
    def __init__(self, port):
        self.port = port

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", path, body=body if isinstance(body, (bytes, str)) else json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data)


def start(path, tmp):
    port = free_port()
    cm = serve_process(ZINFER_BIN, path, tmp / "serve.log", "--ctx-size", 512, "--http",
                       f"127.0.0.1:{port}")
    srv = cm.__enter__()
    wait_http(port, srv)
    return cm, srv, Http(port)


@pytest.fixture(scope="module", params=["bert", "qwen3"])
def reranker(request, tmp_path_factory):
    kind = request.param
    d = tmp_path_factory.mktemp(f"rerank_{kind}")
    if kind == "bert":
        path, t = write_bert_reranker(d / "bert-rerank.gguf")
    else:
        path, t = write_qwen3_reranker(d / "qwen3-rerank.gguf"), None
    cm, srv, h = start(path, d)
    try:
        with Client(srv.addr, timeout_s=60) as c:
            yield {"kind": kind, "path": path, "t": t, "client": c, "http": h, "srv": srv}
    finally:
        cm.__exit__(None, None, None)


def llama_ids(llm, kind, query, doc):
    """The pair's ids as llama.cpp's format_prompt_rerank builds them."""
    if kind == "bert":
        q = llm.tokenize(query.encode(), add_bos=False, special=False)
        dd = llm.tokenize(doc.encode(), add_bos=False, special=False)
        return [llm.token_bos()] + q + [102] + dd  # [CLS] q [SEP] d: add_eos false
    prompt = QWEN_RERANK.replace("{query}", query).replace("{document}", doc)
    return llm.tokenize(prompt.encode(), add_bos=False, special=True)


def llama_score(llm, ids):
    llm._batch.reset()
    llm._batch.add_sequence(ids, 0, False)
    llm._ctx.kv_cache_clear()
    llm._ctx.decode(llm._batch)
    return float(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[0])


def reference_score(r, ids):
    if r["kind"] == "bert":
        t = r["t"]
        h = reference(t, "bert", ids)[0]  # the first token ([CLS])
        h = np.tanh(t["cls.weight"] @ h + t["cls.bias"])
        return float((t["cls.output.weight"] @ h + t["cls.output.bias"])[0])
    if "ref" not in r:
        w = gguf.GGUFReader(str(r["path"]))
        r["ref"] = (numpy_llama.Model(str(r["path"])),
                    next(x for x in w.tensors if x.name == "cls.output.weight").data
                    .astype(np.float64))
    m, wo = r["ref"]
    z = wo @ m.forward(ids, hidden=True)[-1]  # the last token
    z = np.exp(z - z.max())
    return float(z[0] / z.sum())


def test_scores_closer_to_float64_than_llamacpp(reranker):
    r = reranker
    res = r["client"].call("embed", query=QUERY, input=DOCS)
    assert res["pooling"] == "rank"
    emb = res["embeddings"]
    z = np.frombuffer(emb["data"], "<f4").reshape(emb["shape"])
    assert z.shape == (len(DOCS), 1 if r["kind"] == "bert" else 2)
    if r["kind"] == "qwen3":  # softmax over yes / no
        assert np.allclose(z.sum(1), 1.0, atol=1e-6)
    llm = llama_cpp.Llama(model_path=str(r["path"]), embedding=True, n_ctx=512, n_batch=512,
                          n_ubatch=512, n_threads=2, verbose=False,
                          pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK)
    ours, theirs, ref = [], [], []
    for i, doc in enumerate(DOCS):
        ids = llama_ids(llm, r["kind"], QUERY, doc)
        assert res["token_counts"][i] == len(ids), (doc, res["token_counts"][i], len(ids))
        ours.append(float(z[i, 0]))
        theirs.append(llama_score(llm, ids))
        ref.append(reference_score(r, ids))
    ours, theirs, ref = map(np.array, (ours, theirs, ref))
    e_ours, e_theirs = np.abs(ours - ref).max(), np.abs(theirs - ref).max()
    print(f"{r['kind']}: max |score - float64| zinfer {e_ours:.3g}, llama.cpp {e_theirs:.3g}")
    assert e_ours < e_theirs / 100, (e_ours, e_theirs)
    assert e_ours < 1e-5
    assert list(np.argsort(-ours, kind="stable")) == list(np.argsort(-ref, kind="stable"))
    assert list(np.argsort(-theirs, kind="stable")) == list(np.argsort(-ref, kind="stable"))


def test_http_rerank_shape(reranker):
    r = reranker
    res = r["client"].call("embed", query=QUERY, input=DOCS)
    emb = res["embeddings"]
    scores = np.frombuffer(emb["data"], "<f4").reshape(emb["shape"])[:, 0]
    order = [int(i) for i in np.argsort(-scores, kind="stable")]
    for path in ("/v1/rerank", "/rerank"):
        st, body = r["http"].post(path, {"query": QUERY, "documents": DOCS})
        assert st == 200, body
        assert body["object"] == "list" and body["model"]
        assert [x["index"] for x in body["results"]] == order
        assert [x["relevance_score"] for x in body["results"]] == \
            [float(scores[i]) for i in order]
        assert all("document" not in x for x in body["results"])
        assert body["usage"]["prompt_tokens"] == sum(res["token_counts"])
    st, body = r["http"].post("/v1/rerank", {
        "query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 3,
        "return_documents": True})
    assert st == 200, body
    assert [x["index"] for x in body["results"]] == order[:3]
    assert [x["document"]["text"] for x in body["results"]] == [DOCS[i] for i in order[:3]]


BAD = [
    ({"documents": DOCS}, "query"),
    ({"query": 3, "documents": DOCS}, "query"),
    ({"query": "", "documents": DOCS}, "query"),
    ({"query": QUERY}, "documents"),
    ({"query": QUERY, "documents": "one"}, "documents"),
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": ["a", 5]}, "documents[1]"),
    ({"query": QUERY, "documents": [{"txt": "a"}]}, "documents[0]"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": "2"}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents"),
    ({"query": QUERY, "documents": DOCS, "truncate": 1}, "truncate"),
    ({"query": QUERY, "documents": DOCS, "rank_fields": ["x"]}, "rank_fields"),
    ({"query": QUERY, "documents": ["word " * 600]}, "documents[0]"),
]


@pytest.mark.parametrize("reranker", ["bert"], indirect=True)  # one server is enough
@pytest.mark.parametrize("body,field", BAD, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD)])
def test_http_bad_inputs(reranker, body, field):
    st, res = reranker["http"].post("/v1/rerank", body)
    assert st == 400, res
    assert res["error"]["param"] == field, res
    assert field.split("[")[0] in res["error"]["message"], res
    st, res = reranker["http"].post("/v1/rerank", {"query": QUERY, "documents": DOCS[:2]})
    assert st == 200, res


def test_model_without_head_refuses_rank(tmp_path):
    with serve_process(ZINFER_BIN, ZINFER_MODEL, tmp_path / "serve.log") as srv:
        with Client(srv.addr, timeout_s=60) as c:
            with pytest.raises(ZinferError) as ei:
                c.call("embed", query=QUERY, input=DOCS[:2])
            assert ei.value.code == "unsupported"
            assert "rank needs a reranker" in str(ei.value)
            with pytest.raises(ZinferError) as ei:
                c.call("embed", query=QUERY, input=[[1, 2, 3]])
            assert ei.value.code == "invalid_request" and "input" in str(ei.value)
            with pytest.raises(ZinferError) as ei:
                c.call("embed", query=QUERY, input=["a"], pooling="mean")
            assert ei.value.code == "invalid_request" and "pooling" in str(ei.value)


def test_too_many_labels_refused(tmp_path):
    """A head with more labels than zinfer takes (65536) is refused at the
    worker's start, naming the key, not allocated."""
    path, _ = write_bert_reranker(tmp_path / "labels.gguf",
                                  labels=[f"l{i}" for i in range(65537)])
    r = subprocess.run([str(Path(ZINFER_BIN).parent / "zinfer-worker"), "--model", str(path),
                        "--router", "tcp://127.0.0.1:1", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "bert.classifier.output_labels: 65537 labels (at most 65536)" in r.stderr + r.stdout
