"""A disk cache of the float64 references' outputs, shared by test runs.

The references (numpy_llama.py, numpy_hybrid.py, numpy_vision.py) are slow
and deterministic: the same model file, inputs and reference code give the
same float64 arrays. scripts/test runs the end-to-end tests twice (the
release build, then the sanitizer build), and only zinfer's binary differs
between the two, so the first pass stores the references' outputs here and
the second reads them instead of dequantizing the files and running the
forward passes again.

Where: $ZINFER_REFCACHE_DIR, else $ZINFER_HOME/refcache (ZINFER_HOME
defaults to ~/.cache/zinfer). ZINFER_REFCACHE=0 turns the cache off.

An entry's key is the sha256 of: the model file's sha256 (memoized by
the file's path, size, mtime and inode, so a file is read once), the
call and its arguments (token ids, rows, image pixels, LoRA adapters'
files...), and the text of every scripts/ref/*.py but this one plus
numpy's and gguf's versions (editing a reference invalidates every entry;
this file's changes to what an entry holds change _FORMAT). Entries
are .npz files written to a temporary name and renamed, so a reader
never sees half of one; a file that does not load (truncated, corrupt,
another key's) is ignored, removed and recomputed. The directory is kept
under ZINFER_REFCACHE_MAX_MB (default 8192) by removing the least
recently used entries after each write; `rm -rf` of the directory is
always safe.

How the references use it:
  lazy_model(cls, args, kw, pure): what numpy_llama.Model(...) and
    numpy_hybrid.Model(...) return. It loads (dequantizes) nothing until a
    result is missing from the cache: the methods named in `pure` (forward,
    greedy, with only the arguments listed there, none holding state) are
    looked up by key first; anything else (a KV cache or state argument,
    routing lists, the weights themselves) loads the real model and
    calls it. The model's scalar attributes (n_vocab, ...) are stored when
    it is first loaded, so reading them needs no load either. A copy
    (copy.copy, for ablations) is a copy of the real model with its own
    weight dict; setting an attribute on the proxy turns its cache off.
  cached(what, parts, compute): compute() once per key (numpy_vision.embed).

The end-to-end tests' random-weight model files (tests/e2e/*_files.py:
MoE, hybrid, vision, family files) are kept the same way, in a directory
of their own: cached_file(dest, parts, write, sources) runs write(dest)
once per key (the writer's source files, its arguments, the input files'
sha256, and the references' code and versions as above) and copies the
stored file to dest after. Where: $ZINFER_TESTFILES_DIR, else
$ZINFER_HOME/testfiles; ZINFER_TESTFILES=0 turns it off; bounded by
ZINFER_TESTFILES_MAX_MB (default 4096) as the references are.
"""

import copy
import glob
import hashlib
import inspect
import io
import json
import os
import shutil
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_FORMAT = "refcache-1"


def enabled():
    return os.environ.get("ZINFER_REFCACHE", "1") != "0"


def _home():
    return os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer"))


def directory():
    d = os.environ.get("ZINFER_REFCACHE_DIR")
    if d:
        return d
    return os.path.join(_home(), "refcache")


def _max_bytes(var="ZINFER_REFCACHE_MAX_MB", default_mb=8192):
    try:
        return int(float(os.environ.get(var, str(default_mb))) * 2**20)
    except ValueError:
        return default_mb * 2**20


def _write_atomic(path, data):
    """Writes bytes to path through a temporary name and a rename."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:  # a full or read-only disk: the cache is only an optimization
        try:
            os.unlink(tmp)
        except OSError:
            pass


# ---------------------------------------------------------------- identities

_FILE_IDS = {}


def _stamp(path):
    st = os.stat(path)
    stamp = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
    return stamp, os.path.join(directory(), "ids", hashlib.sha256(stamp.encode()).hexdigest())


def _remember_sha256(path, digest):
    """Records digest as the sha256 of the file at path (one just copied
    from a file whose sha256 is known), so file_sha256 need not read it."""
    stamp, memo = _stamp(path)
    _FILE_IDS[stamp] = digest
    if enabled():
        _write_atomic(memo, digest.encode())


def file_sha256(path):
    """The sha256 (hex) of a file's contents, computed once per (path, size,
    mtime, inode): remembered in this process and under directory()/ids."""
    stamp, memo = _stamp(path)
    if stamp in _FILE_IDS:
        return _FILE_IDS[stamp]
    digest = None
    if enabled():
        try:
            with open(memo, encoding="ascii") as f:
                got = f.read().strip()
            if len(got) == 64 and all(c in "0123456789abcdef" for c in got):
                digest = got
        except (OSError, UnicodeDecodeError):
            pass
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        digest = h.hexdigest()
        if enabled():
            _write_atomic(memo, digest.encode())
    _FILE_IDS[stamp] = digest
    return digest


_SOURCES = []


def sources_hash():
    """sha256 over scripts/ref/*.py but this file (names and text), numpy's
    and gguf's versions: the code that makes a reference's numbers."""
    if not _SOURCES:
        h = hashlib.sha256(_FORMAT.encode())
        for p in sorted(glob.glob(os.path.join(_HERE, "*.py"))):
            if os.path.basename(p) == "refcache.py":
                continue  # the cache's own code makes no number; _FORMAT versions its entries
            h.update(os.path.basename(p).encode() + b"\0")
            with open(p, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        h.update(np.__version__.encode() + b"\0")
        try:
            from importlib.metadata import version

            h.update(version("gguf").encode())
        except Exception:  # not installed as a distribution: its source is what it is
            h.update(b"gguf-unknown")
        _SOURCES.append(h.hexdigest())
    return _SOURCES[0]


def _digest(h, v):
    """Feeds a canonical form of v (arrays, numbers, strings, None, and
    lists/tuples/dicts of them) to the hash h."""
    if isinstance(v, (list, tuple)) and v and all(
            isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
            for x in v):
        v = np.asarray(v)
    if isinstance(v, np.ndarray):
        a = v
        if a.dtype.kind in "iu":
            a = a.astype(np.int64)
        elif a.dtype.kind == "f":
            a = a.astype(np.float64)
        a = np.ascontiguousarray(a)
        h.update(f"A{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    elif isinstance(v, (list, tuple)):
        h.update(f"L{len(v)}".encode())
        for x in v:
            _digest(h, x)
    elif isinstance(v, dict):
        h.update(f"D{len(v)}".encode())
        for k in sorted(v):
            _digest(h, str(k))
            _digest(h, v[k])
    elif v is None or isinstance(v, (bool, int, float, str, np.integer, np.floating)):
        h.update(f"S{type(v).__name__}:{v!r}".encode())
    elif hasattr(v, "refcache_key"):  # an object that names its own identity (a LoRA adapter)
        _digest(h, v.refcache_key())
    else:
        raise TypeError(f"refcache: cannot key a {type(v).__name__}")


def key(*parts):
    h = hashlib.sha256()
    _digest(h, (sources_hash(),) + parts)
    return h.hexdigest()


# ---------------------------------------------------------------- entries

def _path(k, ext):
    return os.path.join(directory(), "v1", k[:2], k + ext)


def _encode(value):
    """An array, or a tuple of arrays and number lists (greedy's (tokens,
    gaps)), as npz members."""
    if isinstance(value, np.ndarray):
        return {"form": np.array("array"), "a0": value}
    if isinstance(value, tuple) and all(isinstance(x, (np.ndarray, list)) for x in value):
        out = {"form": np.array("tuple" + "".join("a" if isinstance(x, np.ndarray) else "l"
                                                  for x in value))}
        for i, x in enumerate(value):
            out[f"a{i}"] = np.asarray(x)
        return out
    return None


def _decode(z):
    form = str(z["form"])
    if form == "array":
        return z["a0"]
    kinds = form[len("tuple"):]
    return tuple(z[f"a{i}"] if k == "a" else z[f"a{i}"].tolist() for i, k in enumerate(kinds))


def _get(k):
    p = _path(k, ".npz")
    try:
        with np.load(p, allow_pickle=False) as z:
            if str(z["key"]) != k:
                raise ValueError("another key's entry")
            value = _decode(z)
        os.utime(p)  # recently used: the cleanup removes the oldest first
        return value
    except FileNotFoundError:
        return None
    except Exception:  # truncated or corrupt: recompute it
        try:
            os.unlink(p)
        except OSError:
            pass
        return None


def _put(k, value):
    members = _encode(value)
    if members is None:
        return
    buf = io.BytesIO()
    np.savez(buf, key=np.array(k), **members)
    _write_atomic(_path(k, ".npz"), buf.getvalue())
    _trim(directory(), _max_bytes())


def _trim(root, limit):
    """Removes the least recently used entries under root/v1 while they
    hold more than limit bytes, down to three quarters of it."""
    files = []
    for p in glob.glob(os.path.join(root, "v1", "*", "*")):
        try:
            st = os.stat(p)
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, p))
    total = sum(f[1] for f in files)
    if total <= limit:
        return
    for _, size, p in sorted(files):
        if total <= limit * 3 // 4:
            break
        try:
            os.unlink(p)
            total -= size
        except OSError:
            pass


def cached(what, parts, compute):
    """compute()'s value (an array, or a tuple of arrays and lists), stored
    under key(what, *parts); computed when absent or the cache is off."""
    if not enabled():
        return compute()
    k = key(what, *parts)
    value = _get(k)
    if value is None:
        value = compute()
        _put(k, value)
    return value


def _get_meta(k):
    try:
        with open(_path(k, ".json"), encoding="utf-8") as f:
            meta = json.load(f)
        return meta if isinstance(meta, dict) and meta.get("key") == k else None
    except (OSError, ValueError):
        return None


def _put_meta(k, obj):
    meta = {n: v for n, v in vars(obj).items()
            if isinstance(v, (bool, int, float, str)) and not n.startswith("_")}
    meta["key"] = k
    _write_atomic(_path(k, ".json"), json.dumps(meta).encode())


# ---------------------------------------------------------------- models

def _model_key(cls, args, kw):
    """The key of a model: its class, the file's sha256 and the other
    constructor arguments."""
    bound = inspect.signature(cls.__init__).bind(None, *args, **kw)
    bound.apply_defaults()
    params = dict(bound.arguments)
    params.pop(next(iter(params)))  # self
    path = params.pop("path")
    return key(f"{cls.__module__}.{cls.__qualname__}", file_sha256(path), params)


class _Lazy:
    """Stands for a reference model (see the module docstring)."""

    def __init__(self, cls, args, kw, pure):
        object.__setattr__(self, "_r", {"cls": cls, "args": args, "kw": kw, "pure": pure,
                                        "model": None, "key": None, "meta": None,
                                        "dirty": False})

    # isinstance(proxy, Model) holds, as for the model itself
    @property
    def __class__(self):
        return self._r["cls"]

    def _key(self):
        r = self._r
        if r["key"] is None:
            r["key"] = _model_key(r["cls"], r["args"], r["kw"])
        return r["key"]

    def _real(self):
        r = self._r
        if r["model"] is None:
            m = object.__new__(r["cls"])
            m.__init__(*r["args"], **r["kw"])
            r["model"] = m
            if enabled():
                _put_meta(self._key(), m)
        return r["model"]

    def _meta(self):
        r = self._r
        if r["meta"] is None and enabled():
            r["meta"] = _get_meta(self._key()) or {}
        return r["meta"] or {}

    def __getattr__(self, name):
        r = self._r
        if name.startswith("__"):
            raise AttributeError(name)
        if name in r["pure"] and enabled() and not r["dirty"]:
            return lambda *a, **k: self._call(name, a, k)
        if r["model"] is None:
            meta = self._meta()
            if name in meta and name != "key":
                return meta[name]
        return getattr(self._real(), name)

    def __setattr__(self, name, value):
        self._r["dirty"] = True  # the outputs are no longer the file's
        setattr(self._real(), name, value)

    def __copy__(self):
        m = copy.copy(self._real())
        if isinstance(getattr(m, "w", None), dict):
            m.w = dict(m.w)  # an ablation that drops a weight leaves this one whole
        return m

    def __deepcopy__(self, memo):
        return copy.deepcopy(self._real(), memo)

    def __repr__(self):
        r = self._r
        return f"<refcache proxy of {r['cls'].__name__}{r['args']!r}>"

    def _call(self, name, a, k):
        r = self._r
        method = getattr(r["cls"], name)
        bound = inspect.signature(method).bind(None, *a, **k)
        params = list(inspect.signature(method).parameters.values())[1:]
        args = dict(bound.arguments)
        args.pop(next(iter(args)))
        allowed = r["pure"][name]
        plain = all(p.name in allowed or args.get(p.name, p.default) is p.default
                    or args.get(p.name) is None for p in params)
        if not plain:
            return getattr(self._real(), name)(*a, **k)
        try:
            parts = (self._key(), name, {n: args[n] for n in sorted(args)})
            kk = key(*parts)
        except TypeError:  # an argument with no canonical form
            return getattr(self._real(), name)(*a, **k)
        value = _get(kk)
        if value is None:
            value = getattr(self._real(), name)(*a, **k)
            _put(kk, value)
        return value


def lazy_model(cls, args, kw, pure):
    """A proxy of cls(*args, **kw) (see the module docstring), or None when
    the cache is off (the caller then builds the model itself). pure maps a
    method's name to the arguments whose values key its result; any other
    argument must be absent (its default, or None)."""
    if not enabled():
        return None
    return _Lazy(cls, args, kw, pure)


def loaded(model):
    """Whether model holds its weights: a proxy that has loaded its file, or
    a model built without the cache."""
    r = model.__dict__.get("_r") if type(model) is _Lazy else None
    return r is None or r["model"] is not None


# ---------------------------------------------------------------- test files

def files_enabled():
    return os.environ.get("ZINFER_TESTFILES", "1") != "0"


def files_directory():
    d = os.environ.get("ZINFER_TESTFILES_DIR")
    if d:
        return d
    return os.path.join(_home(), "testfiles")


_TEXTS = {}


def _text_sha256(path):
    """The sha256 of a source file's text, read once per process."""
    path = os.path.realpath(path)
    if path not in _TEXTS:
        with open(path, "rb") as f:
            _TEXTS[path] = hashlib.sha256(f.read()).hexdigest()
    return _TEXTS[path]


def cached_file(dest, parts, write, sources=()):
    """Makes the file dest: write(dest) when the key (sources' texts, parts,
    and what key() adds) has no stored file, else a copy of the stored one.
    parts must name everything else the file's bytes depend on (the
    writer's arguments, the sha256 of files it reads); an argument with no
    canonical form (see _digest) writes the file live. Returns whether dest
    came from the cache."""
    dest = str(dest)
    if not files_enabled():
        write(dest)
        return False
    try:
        k = key("testfile", [_text_sha256(s) for s in sources], parts)
    except TypeError:
        write(dest)
        return False
    stored = os.path.join(files_directory(), "v1", k[:2], k)
    try:
        with open(stored + ".json", encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("key") == k and os.path.getsize(stored) == meta["size"]:
            shutil.copyfile(stored, dest)
            os.utime(stored)  # recently used: the cleanup removes the oldest first
            os.utime(stored + ".json")
            _remember_sha256(dest, meta["sha256"])
            return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # absent, half removed or corrupt: write it again
    write(dest)
    tmp = f"{stored}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.makedirs(os.path.dirname(stored), exist_ok=True)
        shutil.copyfile(dest, tmp)
        os.replace(tmp, stored)
        meta = {"key": k, "size": os.path.getsize(stored), "sha256": file_sha256(dest)}
        _write_atomic(stored + ".json", json.dumps(meta).encode())
    except OSError:  # a full or read-only disk: the cache is only an optimization
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    _trim(files_directory(), _max_bytes("ZINFER_TESTFILES_MAX_MB", 4096))
    return False
