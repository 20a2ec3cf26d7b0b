"""microgpt_xp.data: reading corpora (spec §1), the tokenizer (spec §3), padded batches (§6)
and the epoch-wise batch order."""

from __future__ import annotations

import json
import os
import string
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from microgpt_xp.data import (
    DataError,
    Tokenizer,
    batch_indices,
    block_size_for,
    count_cut,
    default_docs,
    encode_docs,
    read_docs,
    take_batch,
)


def _write(tmp_path: Path, content: bytes, name: str = "docs.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


# -- read_docs ----------------------------------------------------------------------------
#: name: (file content, documents)
READS = {
    "strip": (b"  emma\n\nolivia  \n\t\n   \nava\tx \nzoe\n  \n", ["emma", "olivia", "ava\tx", "zoe"]),
    "no-final-newline": (b"emma\nolivia\nava", ["emma", "olivia", "ava"]),
    "final-newline": (b"emma\nolivia\nava\n", ["emma", "olivia", "ava"]),
    "crlf": (b"emma\r\nolivia\r\nava\r\n", ["emma", "olivia", "ava"]),
    "crlf-no-final": (b"emma\r\nolivia\r\nava", ["emma", "olivia", "ava"]),
    "cr": (b"emma\rava", ["emma", "ava"]),
    "unicode": ("zo\u00eb\nanna\nzo\u00eb\n".encode(), ["zo\u00eb", "anna", "zo\u00eb"]),
    "spec": (b"x\n  y y \n\n\nz\r\n \n", ["x", "y y", "z"]),
    # only \n, \r\n and \r end a line, as in the spec's open(): not U+2028, NEL, FF
    "unicode-separators": ("a\u2028b\nc\x85d\x0ce\n".encode(), ["a\u2028b", "c\x85d\x0ce"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(READS))
def test_read_docs_reads_lines_as_the_spec(tmp_path: Path, case: str) -> None:
    content, docs = READS[case]
    path = _write(tmp_path, content)
    assert read_docs(path) == read_docs(str(path)) == docs
    # spec §1: line by line, strip, keep non-empty lines, in file order
    assert docs == [line.strip() for line in path.open(encoding="utf-8") if line.strip()]


@pytest.mark.parametrize(
    ("content", "match"),
    [(b"", "no documents"), (b"\n", "no documents"), (b"  \n\t\n\r\n   ", "no documents"),
     (None, "cannot read"), (b"emma\nol\xffivia\n", "UTF-8 text .*offset 7")],
    ids=["empty", "newline", "blank", "missing", "undecodable"],
)  # fmt: skip
def test_read_docs_errors_name_the_file(tmp_path: Path, content: bytes | None, match: str) -> None:
    path = tmp_path / "docs.txt" if content is None else _write(tmp_path, content)
    with pytest.raises(DataError, match=match) as info:
        read_docs(path)
    assert str(path) in str(info.value) and issubclass(DataError, ValueError)


def test_read_docs_never_waits_and_drops_a_byte_order_mark(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    for path in (tmp_path, fifo, Path(os.devnull)):
        got: list[BaseException] = []
        reader = threading.Thread(target=lambda p=path, g=got: g.append(_raises(p)), daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert got and "not a regular file" in str(got[0]) and str(path) in str(got[0])
    # read docs drops a byte order mark
    path = _write(tmp_path, b"\xef\xbb\xbfemma\nolivia\n")
    docs = read_docs(path)
    assert docs == ["emma", "olivia"]
    assert "\ufeff" not in Tokenizer.from_docs(docs).chars
    # the offset of a bad byte still counts the mark's 3 bytes
    with pytest.raises(DataError, match="offset 10"):
        read_docs(_write(tmp_path, b"\xef\xbb\xbfemma\nol\xffivia\n"))
    # a mark inside the text is text (only the file's first bytes can be one)
    assert read_docs(_write(tmp_path, "a\n\ufeffb\n".encode())) == ["a", "\ufeffb"]


def _raises(path: Path) -> BaseException:
    with pytest.raises(DataError, match="cannot read") as info:
        read_docs(path)
    return info.value


def test_read_docs_names_txt(names_txt: Path) -> None:
    docs = read_docs(names_txt)
    assert len(docs) == 32033 and docs[0] == names_txt.read_text().split("\n", 1)[0].strip()
    assert {len(d) for d in docs} <= set(range(2, 16))
    tok = Tokenizer.from_docs(docs)
    assert (tok.chars, tok.vocab_size, tok.bos) == (list(string.ascii_lowercase), 27, 26)


# -- default_docs -------------------------------------------------------------------------
def test_default_docs_need_no_shared_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # any attempt to read outside the installed packages (e.g. ../shared/data) fails
    def guarded(real: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: Path, *args: Any, **kwargs: Any) -> Any:
            if "shared" in self.parts or self.name == "names.txt":
                raise AssertionError(f"default_docs read {self}")
            return real(self, *args, **kwargs)

        return read

    monkeypatch.setattr(Path, "read_text", guarded(Path.read_text))
    monkeypatch.setattr(Path, "read_bytes", guarded(Path.read_bytes))
    monkeypatch.chdir(Path("/"))
    docs = default_docs()
    assert len(docs) > 100 and all(d and set(d) <= set(string.ascii_lowercase) for d in docs)
    assert default_docs() == docs
    monkeypatch.setitem(sys.modules, "mimesis", None)  # how Python marks a module absent
    with pytest.raises(DataError, match=r"needs the 'mimesis' package: pip install mimesis"):
        default_docs()


# -- Tokenizer ------------------------------------------------------------------------------
def test_tokenizer_matches_the_spec_and_round_trips() -> None:
    tok = Tokenizer.from_docs(["cab", "bad", "zz"])
    assert (tok.chars, tok.bos, tok.vocab_size) == (["a", "b", "c", "d", "z"], 5, 6)
    assert tok.encode("zadcb") == [4, 0, 3, 2, 1] and tok.encode("") == []
    docs = ["emma", "olivia", "ava", "isabella", "sophia", "zoë", "a b"]
    uchars = sorted(set("".join(docs)))
    tok = Tokenizer.from_docs(docs)
    assert tok.chars == uchars and tok.bos == len(uchars)
    for doc in docs:
        assert tok.encode_doc(doc) == [len(uchars)] + [uchars.index(c) for c in doc] + [len(uchars)]
        assert tok.decode(tok.encode(doc)) == doc and tok.decode(tok.encode_doc(doc)) == doc
    assert tok.decode(np.array(tok.encode_doc("sophia"), dtype=np.int64)) == "sophia"
    back = Tokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
    assert back == tok and hash(back) == hash(tok) and back.chars == tok.chars
    assert back.encode("zoë") == tok.encode("zoë") and Tokenizer.from_docs(["abc"]) != tok
    # decode rows equals decode of each row
    tok = Tokenizer("abcñ")
    bos = tok.bos
    rng = np.random.default_rng(0)
    ids = rng.integers(0, bos, (200, 9))
    ids[np.arange(9)[None, :] >= rng.integers(0, 10, 200)[:, None]] = bos  # BOS suffixes
    assert tok.decode_rows(ids) == [tok.decode(row) for row in ids]
    mixed = np.array([[0, bos, 1, bos], [bos, bos, 2, 3]])  # BOS inside: skipped as decode does
    assert tok.decode_rows(mixed) == ["ab", "cñ"]
    assert tok.decode_rows(np.zeros((0, 4), dtype=np.int64)) == []
    assert tok.decode_rows(np.zeros((2, 0), dtype=np.int64)) == ["", ""]
    nul = Tokenizer("a\0")  # a NUL character is not taken for padding
    assert nul.decode_rows(np.array([[1, 0, 2], [0, 0, 2]])) == ["a\0", "\0\0"]


@pytest.mark.parametrize(
    ("call", "match"),
    [(lambda: Tokenizer("abc").encode("abqc"), "'q' at position 2 of 'abqc'"),
     (lambda: Tokenizer("abc").encode_doc("Q"), "'Q'"),
     *[(lambda bad=bad: Tokenizer("abc").decode([0, bad]), str(bad)) for bad in (4, -1, 100)],
     (lambda: Tokenizer([]), "at least one"), (lambda: Tokenizer(["ab", "c"]), "single"),
     (lambda: Tokenizer("ab").decode_rows(np.array([[0, 3]])), "token id 3 is outside"),
     (lambda: Tokenizer("ab").decode_rows(np.array([[-1, 0]])), "token id -1 is outside"),
     (lambda: Tokenizer("ab").decode_rows(np.array([0, 1])), r"\(N, T\) array")],
)  # fmt: skip
def test_tokenizer_errors(call: Callable[[], Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_tokenizer_errors_quote_a_short_prefix_of_a_long_document() -> None:
    doc = "a" * 10_000_000 + "q"
    with pytest.raises(ValueError, match="'q' at position 10000000") as info:
        Tokenizer("a").encode(doc)
    message = str(info.value)
    assert len(message) < 200 and "10,000,001 characters" in message
    assert repr("a" * 40) + "…" in message
    with pytest.raises(ValueError, match="10,000,001 characters") as info:
        Tokenizer([doc])
    assert len(str(info.value)) < 200


# -- encode_docs ----------------------------------------------------------------------------
@pytest.mark.parametrize("docs", [["a", "abcde", "abc"], ["abcdefghijklmnop"], [""]])
def test_block_size_for_reads_every_document_whole(docs: list[str]) -> None:
    block_size = block_size_for(docs)
    assert block_size == max(map(len, docs)) + 1
    tok = Tokenizer.from_docs(["abcdefghijklmnop"])
    tokens, lengths = encode_docs(tok, docs, block_size)
    assert [tok.decode(row[:n]) for row, n in zip(tokens, lengths, strict=True)] == docs
    assert lengths.tolist() == [len(d) + 2 for d in docs]  # both BOS kept
    assert count_cut(docs, block_size) == 0
    assert count_cut(docs, block_size - 1) == sum(len(d) == block_size - 1 for d in docs)


def test_encode_docs_pads_right_with_bos_and_checks_what_it_keeps() -> None:
    tok = Tokenizer.from_docs(["ab", "c"])
    bos = tok.bos
    tokens, lengths = encode_docs(tok, ["ab", "c", "abcab"], block_size=16)
    assert tokens.dtype == lengths.dtype == np.int64 and tokens.shape == (3, 7)
    np.testing.assert_array_equal(lengths, [4, 3, 7])
    want = [
        [bos, 0, 1, bos, bos, bos, bos],
        [bos, 2, bos, bos, bos, bos, bos],
        [bos, 0, 1, 2, 0, 1, bos],
    ]
    np.testing.assert_array_equal(tokens, want)
    t, lens = take_batch(tokens, lengths, np.array([1, 0]))  # trimmed to the longest
    np.testing.assert_array_equal(lens, [3, 4])
    np.testing.assert_array_equal(t, tokens[[1, 0], :4])
    # only the characters kept must be in the vocabulary
    with pytest.raises(DataError, match="no documents"):
        encode_docs(Tokenizer.from_docs(["ab"]), [], 16)
    with pytest.raises(ValueError, match="'z'"):
        encode_docs(Tokenizer.from_docs(["ab"]), ["ab", "az"], 16)
    tok = Tokenizer.from_docs(["abc"])
    tokens, lengths = encode_docs(tok, ["abcq", "ab"], block_size=3)  # 'q' is cut off
    assert tok.decode(tokens[0]) == "abc" and lengths.tolist() == [4, 4]
    with pytest.raises(ValueError, match="'q' at position 2"):
        encode_docs(tok, ["abqc"], block_size=3)


@pytest.mark.parametrize("block_size", [1, 2, 3, 5, 6, 7, 16])
def test_encode_docs_truncates_like_the_spec_and_count_cut_counts(block_size: int) -> None:
    docs = ["abcde", "a", "edcba", "ab", ""]
    tok = Tokenizer.from_docs(docs)
    tokens, lengths = encode_docs(tok, docs, block_size)
    cut = sum(n < len(d) + 2 for d, n in zip(docs, lengths, strict=True))
    assert count_cut(docs, block_size) == cut
    for i, doc in enumerate(docs):
        full = tok.encode_doc(doc)
        n = min(block_size, len(full) - 1)  # spec §6: the number of predictions
        assert lengths[i] == n + 1
        np.testing.assert_array_equal(tokens[i, : n + 1], full[: n + 1])
        assert np.all(tokens[i, n + 1 :] == tok.bos)
    assert tokens.shape[1] == int(lengths.max()) <= block_size + 1


def test_encoding_memory_follows_what_the_block_size_keeps() -> None:
    """A 4 MB line with a block size of 16: the tokenizer and the encoding hold about 16
    ids of it, not 4 million (a 200 MB line took 3.7 GB)."""
    import tracemalloc

    docs = ["emma", "xyz" * 1_400_000, "olivia"]
    tracemalloc.start()
    try:
        tok = Tokenizer.from_docs(docs)
        tokens, lengths = encode_docs(tok, docs, block_size=16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, f"{peak / 2**20:.1f} MiB traced for a 4 MB line"
    assert tokens.shape == (3, 17) and lengths.tolist() == [6, 17, 8]
    assert tok.decode(tokens[1]) == ("xyz" * 6)[:16]


# -- batch_indices ----------------------------------------------------------------------------
def test_batch_indices_depend_only_on_their_arguments() -> None:
    a = [batch_indices(10, 3, s, seed=7) for s in range(8)]
    for s, x in reversed(list(enumerate(a))):  # no hidden state: in any order, the same
        np.testing.assert_array_equal(batch_indices(10, 3, s, seed=7), x)
    c = [batch_indices(10, 3, s, seed=8) for s in range(8)]
    assert any(not np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    for s in range(20):
        idx = batch_indices(13, 5, s, seed=0)
        assert idx.shape == (5,) and np.issubdtype(idx.dtype, np.integer)
        assert idx.min() >= 0 and idx.max() < 13
    for num_docs, batch_size, match in ((10, 0, "batch size"), (10, -3, "batch size"),
                                        (3, 4, r"3 documents.*batch size 4")):  # fmt: skip
        with pytest.raises(DataError, match=match):
            batch_indices(num_docs, batch_size, 0, seed=0)


@pytest.mark.parametrize(("num_docs", "batch_size"), [(12, 4), (10, 3), (7, 7), (5, 1), (10, 4)])
def test_batch_indices_each_doc_once_per_epoch(num_docs: int, batch_size: int) -> None:
    """Epochs are read in order across batches: (10, 4)'s step 2 takes the last 2 of epoch
    0 and the first 2 of epoch 1."""
    epochs = 3
    steps = -(-epochs * num_docs // batch_size)
    stream = np.concatenate([batch_indices(num_docs, batch_size, s, seed=1) for s in range(steps)])
    for s in range(steps):
        assert len(batch_indices(num_docs, batch_size, s, seed=1)) == batch_size
    for e in range(epochs):
        epoch = stream[e * num_docs : (e + 1) * num_docs]
        assert sorted(epoch.tolist()) == list(range(num_docs))
    # epochs are reshuffled
    assert num_docs < 3 or not all(
        np.array_equal(stream[:num_docs], stream[e * num_docs : (e + 1) * num_docs])
        for e in range(1, epochs)
    )
