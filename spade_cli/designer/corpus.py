"""The grounding corpus: where the Designer's documents come from, and how they are picked.

SPADE grounds every design prompt in a document sampled from a pretraining-style corpus, so that
the Designer writes environments about banking, chemistry or train timetables instead of the same
three grid worlds (the paper's grounding ablation: Vendi score / n of 0.68 with grounding vs 0.04
without). ``--corpus`` accepts:

- nothing: the bundled sample in ``spade_cli/data/corpus/`` (a few dozen short encyclopedia-style
  paragraphs written for this project, enough for the quickstart and the tests);
- a ``.jsonl`` or ``.parquet`` file whose rows have a text field (``text``, ``content``,
  ``document`` or ``body``) and optionally an id (``id``, ``doc_id``, ``url``, ``title``);
- a folder of ``.txt`` files (the id is the relative path) and/or ``.jsonl`` files;
- a ``datasets`` source, streamed (``datasets.load_dataset(..., streaming=True)``), so a web-scale
  corpus is never downloaded or held whole: a Hugging Face dataset id ``NAME`` or ``NAME:CONFIG``
  (``HuggingFaceFW/fineweb-edu:sample-10BT``, ``mlfoundations/dclm-baseline-1.0``), or local files
  through a packaged builder, ``parquet:GLOB``, ``json:GLOB`` (JSONL, also ``.jsonl.gz``),
  ``csv:GLOB`` or ``text:GLOB``. Options follow a ``?``: ``split`` (default ``train``), ``field``
  (the text column; default the first of ``text``, ``content``, ``document``, ``body``), ``id`` (the
  id column; default the first of ``id``, ``doc_id``, ``url``, ``title``, else a hash of the text)
  and ``limit`` (how many documents of the stream are read, default 20000), e.g.
  ``HuggingFaceFW/fineweb-edu:sample-10BT?split=train&field=text&limit=50000``. Offline, a hub id
  fails with a message naming the dataset.

Only the first ``limit`` documents of a stream are candidates: the stream's order is fixed by the
dataset's files, so the candidates, and therefore every pick below, are the same on every run and
machine; a larger ``limit`` samples from more of the corpus at the cost of reading it.

Documents are picked reproducibly and independently of file order: for each prompt group the
document with the smallest ``sha256(doc_id | seed | iteration | group)`` among those not yet taken
wins. Adding, removing or reordering unrelated files changes a pick only when the new document
itself wins. Long documents are cut to an excerpt whose start is derived from the same hash.

    docs = load_corpus(None)                          # the bundled sample
    picks = select_docs(docs, groups=6, seed=0, iteration=3)
    excerpt(picks[0]["text"], 1200, key="...")
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from spade_cli.core.artifacts import InputError, SpadeError, json_line

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "corpus"
TEXT_FIELDS = ("text", "content", "document", "body")
ID_FIELDS = ("id", "doc_id", "url", "title")


def _text_id(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _doc_from_row(row: object, source: str, path: Path | str, line: int | None,
                  field: str | None = None, id_field: str | None = None) -> dict:
    if not isinstance(row, dict):
        raise InputError(path, line, f"a corpus row must be a JSON object, got {type(row).__name__}")
    fields = (field,) if field else TEXT_FIELDS
    text = next((row[f] for f in fields if isinstance(row.get(f), str)), None)
    if text is None:
        have = ", ".join(sorted(map(str, row))) or "none"
        want = f"a string field {field!r}" if field else f"a text field (one of {', '.join(TEXT_FIELDS)})"
        raise InputError(path, line, f"a corpus row needs {want}; its fields: {have}")
    ids = (id_field,) if id_field else ID_FIELDS
    doc_id = next((str(row[f]) for f in ids if row.get(f) not in (None, "")), None)
    return {"id": doc_id or _text_id(text), "source": str(row.get("source") or source), "text": text}


def _read_jsonl(path: Path, source: str) -> list[dict]:
    docs = []
    with open(path, "rb") as fh:  # bytes: json_line names a line that is not UTF-8 too
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            docs.append(_doc_from_row(json_line(path, lineno, raw), source, path, lineno))
    return docs


def _read_parquet(path: Path, source: str) -> list[dict]:
    import pyarrow.parquet as pq  # arrives with datasets

    table = pq.read_table(path)
    return [_doc_from_row(row, source, path, i + 1) for i, row in enumerate(table.to_pylist())]


def _read_folder(folder: Path) -> list[dict]:
    docs = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.suffix == ".txt":
            docs.append({"id": rel, "source": folder.name, "text": p.read_text(encoding="utf-8")})
        elif p.suffix == ".jsonl":
            docs.extend(_read_jsonl(p, p.stem))
        elif p.suffix == ".parquet":
            docs.extend(_read_parquet(p, p.stem))
    return docs


BUILDERS = ("parquet", "json", "csv", "text")
OPTIONS = ("split", "field", "id", "limit")


def parse_source(spec: str) -> tuple[str, dict]:
    """``SOURCE?k=v&...`` -> (SOURCE, options); unknown or malformed options are a SpadeError."""
    source, _, query = spec.partition("?")
    opts: dict = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if key not in OPTIONS or not eq or not value:
            raise SpadeError(f"--corpus {spec!r}: {part!r} is not an option (use {'=..., '.join(OPTIONS)}=...)")
        opts[key] = value
    if "limit" in opts:
        if not opts["limit"].isdigit() or int(opts["limit"]) < 1:
            raise SpadeError(f"--corpus {spec!r}: limit must be a positive integer")
        opts["limit"] = int(opts["limit"])
    return source, opts


def _read_stream(spec: str, source: str, opts: dict, limit: int) -> list[dict]:
    """The first ``limit`` rows of a streamed ``datasets`` source (see the module docstring)."""
    builder, colon, files = source.partition(":")
    local = colon and builder in BUILDERS
    if local:
        import glob

        matched = sorted(glob.glob(files, recursive=True))
        if not matched:
            raise SpadeError(f"--corpus {spec!r}: no file matches {files!r}")
        args: tuple = (builder,)
        kwargs: dict = {"data_files": matched}
    else:
        repo, _, config = source.partition(":")
        args, kwargs = (repo, config or None), {}
    field, id_field = opts.get("field"), opts.get("id")
    if builder == "text" and local:
        field = field or "text"  # the text builder's one column
    try:
        import datasets

        stream = datasets.load_dataset(*args, split=opts.get("split", "train"), streaming=True, **kwargs)
        rows = []
        for i, row in enumerate(stream):
            if i >= opts.get("limit", limit):
                break
            rows.append(_doc_from_row(row, source, spec, i + 1, field, id_field))
        return rows
    except InputError:
        raise
    except Exception as exc:  # datasets raises many types: offline, not found, gated, bad split
        hint = ("" if local else " Offline, pass local files (parquet:GLOB, json:GLOB, a JSONL or Parquet "
                "file, or a folder of .txt files).")
        raise SpadeError(f"cannot stream the corpus {spec!r} with datasets ({type(exc).__name__}: {exc}).{hint}"
                         ) from None


def load_corpus(src: str | Path | None, limit: int = 20000) -> list[dict]:
    """Documents ``{id, source, text}`` from a corpus spec (see the module docstring)."""
    if src is None or str(src) == "":
        docs = _read_folder(BUNDLED)
        label = "the bundled corpus sample"
    elif "?" in str(src) or str(src).split(":", 1)[0] in BUILDERS:
        source, opts = parse_source(str(src))
        docs, label = _read_stream(str(src), source, opts, limit), str(src)
    else:
        p = Path(src)
        label = str(src)
        if p.is_dir():
            docs = _read_folder(p)
        elif p.is_file() and p.suffix == ".parquet":
            docs = _read_parquet(p, p.stem)
        elif p.is_file():
            docs = _read_jsonl(p, p.stem)
        elif p.suffix in (".jsonl", ".json", ".parquet", ".txt"):
            raise InputError(p, None, "no such corpus file")
        else:
            docs = _read_stream(str(src), str(src), {}, limit)
    docs = [d for d in docs if d["text"].strip()]
    if not docs:
        raise SpadeError(f"{label} holds no documents with text")
    seen: dict[str, dict] = {}
    for d in docs:  # a duplicated id would make the pick depend on file order
        seen.setdefault(d["id"], d)
    return list(seen.values())


def _rank(doc_id: str, seed: int, iteration: int, group: int) -> str:
    return hashlib.sha256(f"{doc_id}|{seed}|{iteration}|{group}".encode()).hexdigest()


def select_docs(docs: list[dict], groups: int, seed: int, iteration: int) -> list[dict]:
    """One document per group, distinct while the corpus is large enough, order-independent."""
    taken: set[str] = set()
    out = []
    for g in range(groups):
        pool = [d for d in docs if d["id"] not in taken] or docs
        best = min(pool, key=lambda d: _rank(d["id"], seed, iteration, g))
        taken.add(best["id"])
        out.append(best)
    return out


def excerpt(text: str, chars: int, key: str) -> str:
    """At most ``chars`` characters of ``text``: the whole text when short, else a window whose start
    comes from ``key`` (so a long document yields different excerpts across iterations), snapped to
    a sentence start and a word end, and marked with ellipses where it was cut."""
    text = " ".join(text.split()) if "\n\n" not in text else text.strip()
    if len(text) <= chars:
        return text
    span = len(text) - chars
    start = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % (span + 1)
    if start:
        dot = text.find(". ", start)
        start = dot + 2 if 0 <= dot < start + chars // 4 else start
    window = text[start:start + chars]
    if start + chars < len(text) and " " in window:
        window = window[:window.rfind(" ")]
    return ("…" if start else "") + window.strip() + ("…" if start + len(window) < len(text) else "")
