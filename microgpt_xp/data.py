"""Documents, the character tokenizer and padded ``(tokens, lengths)`` batches, on the host
(NumPy arrays; the caller moves batches to a backend)."""

from __future__ import annotations

import codecs
import functools
import importlib.util
import json
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._checks import check_reduction
from ._errors import ArgumentTypeError, ArgumentValueError


class DataError(ValueError):
    """A corpus or batch request that cannot be used (empty, undecodable, too small);
    ``param`` names the argument at fault where there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        if param is not None:
            self.param = param


def docs_from_text(text: str) -> list[str]:
    r"""Documents from text as the spec reads ``input.txt``: one per line (ended by ``\n``,
    ``\r\n`` or ``\r``, as ``open()`` reads lines), surrounding whitespace stripped, empty
    lines dropped, in order."""
    return [doc for line in _newlines(text).split("\n") if (doc := line.strip())]


def _newlines(text: str) -> str:
    r"""``text`` with ``\r\n`` and ``\r`` as ``\n`` (as ``open()`` reads lines)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def read_docs(path: str | Path) -> list[str]:
    """The documents of a UTF-8 text file (:func:`docs_from_text`, a leading BOM dropped);
    :class:`DataError` for a missing or irregular file (never waited on), non-UTF-8 or none."""
    docs = docs_from_text(_read_utf8(path))
    if not docs:
        raise DataError(f"data file {str(path)!r} holds no documents (it is empty or blank)")
    return docs


def read_text(path: str | Path) -> str:
    """A UTF-8 text file as one stream (``train(text=...)``), read as ``open()`` does (a
    leading BOM dropped); :class:`DataError` as :func:`read_docs`, or under two characters."""
    text = _newlines(_read_utf8(path))
    if len(text) < 2:
        raise DataError(
            f"data file {str(path)!r} holds {len(text)} characters, too few to train on"
        )
    return text


def _read_utf8(path: str | Path) -> str:
    """The text of a UTF-8 file, a leading byte-order mark dropped (see read_docs)."""
    name = repr(str(path))
    try:  # non-blocking: opening a FIFO without a writer returns at once
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise DataError(
                    f"cannot read data file {name}: it is not a regular file (a folder, FIFO "
                    "or device, which might never end); save the documents to a file first"
                )
            with open(fd, "rb", closefd=False) as f:
                raw = f.read()
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataError(f"cannot read data file {name}: {exc.strerror or exc}") from exc
    start = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return str(memoryview(raw)[start:], "utf-8")  # no copy of the bytes
    except UnicodeDecodeError as exc:
        raise DataError(
            f"data file {name} is not UTF-8 text (undecodable byte at offset {start + exc.start})"
        ) from exc


def default_docs() -> list[str]:
    """The default corpus: ``mimesis``'s English first names (about 3,300), lowercased,
    deduplicated, a–z only, sorted."""
    spec = importlib.util.find_spec("mimesis")  # found, not imported (its import is slow)
    if spec is None or spec.origin is None:
        raise DataError(
            "the embedded default corpus needs the 'mimesis' package: pip install mimesis"
        )
    data = (Path(spec.origin).parent / "datasets" / "en" / "person.json").read_text("utf-8")
    docs = {n.strip().lower() for group in json.loads(data)["names"].values() for n in group}
    return sorted(d for d in docs if d and d.isascii() and d.isalpha())


def _quote(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut to its first ``limit`` characters and its length when longer."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}… ({len(text):,} characters)"


def split_docs(
    docs: Sequence[str], fraction: float, seed: int, param: str = "fraction"
) -> tuple[list[str], list[str]]:
    """``(train, held_out)`` in corpus order, ``round(fraction * len(docs))`` documents (at
    least one) held out by ``numpy.random.default_rng([seed, 1])``; ``DataError`` naming
    ``param`` unless ``0 < fraction < 1`` leaves a document on each side."""
    _check_fraction(fraction, param)
    n = len(docs)
    held = max(1, round(fraction * n))
    if held >= n:
        raise DataError(
            f"holding out {held} of {n} documents leaves none to train on: a smaller "
            "fraction, or more documents",
            param,
        )
    chosen = set(np.random.default_rng([seed, 1]).permutation(n)[:held].tolist())
    return (
        [d for i, d in enumerate(docs) if i not in chosen],
        [d for i, d in enumerate(docs) if i in chosen],
    )


def _check_fraction(fraction: float, param: str) -> None:
    if not 0.0 < fraction < 1.0:
        raise DataError(f"the held-out fraction must lie in (0, 1), got {fraction!r}", param)


def check_docs(docs: Sequence[str] | None, what: str) -> list[str]:
    """``docs`` (``None``: :func:`default_docs`) as a list of strings, else ``DataError`` or
    ``ArgumentTypeError`` naming the argument ``what``."""
    if docs is None:
        return default_docs()
    if isinstance(docs, (str, bytes)):
        raise ArgumentTypeError(
            what, f"{what} must be a sequence of documents, not one string: [text] or text="
        )
    docs = list(docs)
    if not docs:
        raise DataError(f"{what}: the corpus holds no documents", what)
    for d in docs:
        if not isinstance(d, str):
            raise ArgumentTypeError(
                what, f"documents must be strings, got {type(d).__name__}: {d!r}"
            )
    return docs


class Tokenizer:
    """microgpt's character tokenizer: ids ``0..len(chars)-1`` for the sorted distinct
    characters, then ``bos = len(chars)`` (start and end of a document)."""

    def __init__(self, chars: Iterable[str]) -> None:
        chars = sorted(set(chars))
        for ch in chars:
            if not isinstance(ch, str) or len(ch) != 1:
                got = _quote(ch) if isinstance(ch, str) else repr(ch)
                raise ValueError(f"tokenizer characters must be single characters, got {got}")
        if not chars:
            raise ValueError("a tokenizer needs at least one character")
        self.chars: list[str] = chars
        self._ids = {ch: i for i, ch in enumerate(chars)}

    @classmethod
    def from_docs(cls, docs: Iterable[str]) -> Tokenizer:
        """The tokenizer of every character that occurs in ``docs``."""
        return cls(set().union(*docs))  # no joined copy of the corpus

    @property
    def bos(self) -> int:
        """The BOS id."""
        return len(self.chars)

    @property
    def vocab_size(self) -> int:
        """Number of ids, characters plus BOS."""
        return len(self.chars) + 1

    def encode(self, doc: str) -> list[int]:
        """Character ids of ``doc`` (no BOS); ``ValueError`` naming the first unknown
        character, its position and the document."""
        try:
            return [self._ids[ch] for ch in doc]
        except KeyError as exc:
            ch = exc.args[0]
            raise ValueError(
                f"character {ch!r} at position {doc.index(ch)} of {_quote(doc)} is not in "
                "the tokenizer's vocabulary"
            ) from None

    def encode_doc(self, doc: str) -> list[int]:
        """``[BOS] + encode(doc) + [BOS]``, the spec's encoding of a training document."""
        return [self.bos, *self.encode(doc), self.bos]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of character ids, BOS ids skipped; ``ValueError`` for ids outside
        ``[0, vocab_size)``."""
        return self.decode_rows(np.array([[int(i) for i in ids]], dtype=np.int64))[0]

    def decode_rows(self, ids: np.ndarray) -> list[str]:
        """:meth:`decode` of every row of a ``(N, T)`` integer array (BOS skipped)."""
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"decode_rows takes a (N, T) array, got shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"token id {bad} is outside [0, {self.vocab_size})")
        if ids.shape[1] == 0:
            return [""] * ids.shape[0]
        is_bos = ids == self.bos
        if "\0" not in self._ids and np.all(is_bos[:, 1:] >= is_bos[:, :-1]):
            # BOS only at the ends of rows (the sampler's layout): BOS -> NUL, which a
            # fixed-width NumPy string drops, in one vectorized pass
            table = np.array([*self.chars, "\0"])
            rows = np.ascontiguousarray(table[ids]).view(f"<U{ids.shape[1]}")
            return rows[:, 0].tolist()  # type: ignore[no-any-return]
        return ["".join(self.chars[i] for i in row if i != self.bos) for row in ids.tolist()]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (for checkpoints)."""
        return {"chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tokenizer:
        """Inverse of :meth:`to_dict`."""
        return cls(d["chars"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(tuple(self.chars))

    def __repr__(self) -> str:
        return f"Tokenizer(chars={''.join(self.chars)!r})"


def check_tokenizer(tokenizer: Any, vocab_size: int) -> Tokenizer:
    """``tokenizer`` if it is a :class:`Tokenizer` of ``vocab_size`` ids (the model's), else
    an ``ArgumentTypeError``/``ArgumentValueError`` naming ``tokenizer``."""
    if not isinstance(tokenizer, Tokenizer):
        raise ArgumentTypeError(
            "tokenizer", f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}"
        )
    if tokenizer.vocab_size != vocab_size:
        raise ArgumentValueError(
            "tokenizer", f"tokenizer has {tokenizer.vocab_size} ids but the model {vocab_size}"
        )
    return tokenizer


def block_size_for(docs: Iterable[str]) -> int:
    """The block size that reads every document whole, BOS to BOS: ``len(longest) + 1``."""
    return max(map(len, docs), default=0) + 1


def default_block_size(docs: Iterable[str]) -> int:
    """The spec's 16, or more where 16 would cut a document (:func:`block_size_for`)."""
    return max(16, block_size_for(docs))


def count_cut(docs: Iterable[str], block_size: int) -> int:
    """How many documents :func:`encode_docs` cuts at ``block_size`` (longer than
    ``block_size - 1`` characters)."""
    return sum(len(d) >= block_size for d in docs)


def encode_docs(
    tokenizer: Tokenizer, docs: Sequence[str], block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ``(tokens (N, L) int64, lengths (N,) int64)``: each row ``BOS, chars…,
    BOS`` cut to ``block_size + 1`` tokens (silently, see :func:`count_cut`) and padded with
    BOS. Documents are cut before encoding: only the characters kept must be in the
    vocabulary (``ValueError`` otherwise)."""
    if not docs:
        raise DataError("no documents to encode")
    rows = [tokenizer.encode_doc(d[:block_size])[: block_size + 1] for d in docs]
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    tokens = np.full((len(rows), int(lengths.max())), tokenizer.bos, dtype=np.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    return tokens, lengths


def batch_indices(num_docs: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Indices ``(batch_size,)`` of step ``step`` (0-based): its ``batch_size`` positions
    in :func:`epoch_positions` (a resumed run sees the same batches)."""
    if batch_size < 1:
        raise DataError(f"batch size must be at least 1, got {batch_size}", "batch_size")
    if num_docs < batch_size:
        raise DataError(
            f"the corpus has {num_docs} documents, fewer than the batch size {batch_size}",
            "batch_size",
        )
    return epoch_positions(num_docs, step * batch_size, batch_size, seed)


def epoch_positions(num_docs: int, start: int, count: int, seed: int) -> np.ndarray:
    """Positions ``start .. start + count - 1`` (``count >= 1``) of the stream of epochs,
    epoch ``e`` a permutation of ``range(num_docs)`` by ``default_rng([seed, e])``."""
    first, last = start // num_docs, (start + count - 1) // num_docs
    perms = [_permutation(num_docs, seed, e) for e in range(first, last + 1)]
    stream = perms[0] if len(perms) == 1 else np.concatenate(perms)
    offset = start - first * num_docs
    return np.array(stream[offset : offset + count])


@functools.lru_cache(maxsize=4)
def _permutation(num_docs: int, seed: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s permutation (read-only, cached: every step of a run reads it)."""
    perm = np.random.default_rng([seed, epoch]).permutation(num_docs)
    perm.flags.writeable = False
    return perm


def predicted(lengths: np.ndarray, block_size: int) -> np.ndarray:
    """The tokens each row of ``lengths (B,)`` predicts: ``min(lengths - 1, block_size)``."""
    return np.minimum(lengths - 1, block_size)  # type: ignore[no-any-return]


def length_groups(lengths: np.ndarray, block_size: int, call_cost: float) -> list[np.ndarray]:
    """Row indices of ``lengths (B,)`` in groups of near-equal length, shortest first, that
    minimize the positions computed (each group trimmed) plus ``call_cost`` a group."""
    computed, useful = padding(lengths, block_size)
    if computed - useful <= call_cost:
        return [np.arange(len(lengths))]  # even no padding at all would not pay for a call
    n = predicted(lengths, block_size)
    order = np.argsort(n, kind="stable")
    p = n[order]
    ends = np.append(np.flatnonzero(np.diff(p)) + 1, len(p))  # a group ends where p changes
    starts = np.append(0, ends)  # candidate starts: 0 and every end
    best = np.zeros(len(starts))  # best[j]: the cost of rows 0..starts[j] - 1
    back = np.zeros(len(starts), dtype=np.int64)
    for j in range(1, len(starts)):
        costs = best[:j] + (starts[j] - starts[:j]) * p[starts[j] - 1] + call_cost
        back[j] = int(np.argmin(costs))
        best[j] = costs[back[j]]
    cuts, j = [], len(starts) - 1
    while j > 0:
        cuts.append((int(starts[back[j]]), int(starts[j])))
        j = int(back[j])
    return [order[a:b] for a, b in reversed(cuts)]


def pack_batch(
    tokens: np.ndarray,
    lengths: np.ndarray,
    block_size: int,
    reduction: str = "mean",
    *,
    width: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A batch of documents ``tokens (B, L)``, ``lengths (B,)`` (rows ``BOS, chars…, BOS``)
    packed into fewer rows, first-fit decreasing (deterministic) into rows of the room
    (from the longest document's predictions to ``block_size``) that computes the fewest
    positions (``width`` given: ``block_size``, the fewest rows): ``(tokens (R, T + 1),
    lengths (R,), positions (R, T) int64, weights (R, T) float64)``, what
    :func:`~microgpt_xp.loss_and_grads` takes as a packed batch.

    A row holds documents whose predictions (``n = min(length - 1, block_size)`` each) add
    up to at most its room, sharing their BOS: ``BOS a… BOS b… BOS``. ``positions``
    is each input's position in its document (0 at its BOS; 0 at padding); ``weights`` its
    share of the batch loss: ``1 / (n · B)`` for ``"mean"``, ``1 / Σn`` for ``"token_mean"``,
    0 at padding, so that the packed loss is ``Σ weights · losses``, the unpacked batch's
    loss (to rounding), and row shards' results add up. A document that does not end with
    the token it starts with (one cut at ``block_size``) gets a row of its own. ``T`` is
    the longest row's inputs, or ``width`` if given (``>=`` that: one shape a run)."""
    check_reduction(reduction)
    n = predicted(lengths, block_size)
    starts, ends = tokens[:, 0], tokens[np.arange(len(n)), n]
    shares = ((ends == starts) & (starts == starts[0])).tolist()  # BOS to BOS: may share
    sizes = n.tolist()
    order = sorted(range(len(sizes)), key=lambda d: -sizes[d])  # stable: ties in batch order
    rows, used = _first_fit(sizes, order, shares, block_size)
    if width is None:  # a smaller room may need as many rows, each shorter: fewer positions
        for room in range(block_size - 1, max(sizes) - 1, -1):
            fewer, fewer_used = _first_fit(sizes, order, shares, room)
            if len(fewer) * max(fewer_used) < len(rows) * max(used):
                rows, used = fewer, fewer_used
    t = max(used) if width is None else width
    # every prediction's slot: document d's k-th input at row r, column (d's offset) + k
    docs = np.array([d for row in rows for d in row], dtype=np.int64)
    row_of = np.repeat(np.arange(len(rows)), [len(row) for row in rows])
    count = n[docs]
    before = np.cumsum(count) - count  # the predictions before each document, all rows
    firsts = np.cumsum([0] + [len(row) for row in rows[:-1]])  # each row's first document
    offset = before - np.repeat(before[firsts], [len(row) for row in rows])  # in its row
    slot_doc = np.repeat(docs, count)
    k = np.arange(int(count.sum())) - np.repeat(before, count)
    slot_row, slot_col = np.repeat(row_of, count), np.repeat(offset, count) + k
    out = np.zeros((len(rows), t + 1), dtype=tokens.dtype)
    out[slot_row, slot_col] = tokens[slot_doc, k]
    out[slot_row, slot_col + 1] = tokens[slot_doc, k + 1]  # a shared BOS: the same token twice
    pos = np.zeros((len(rows), t), dtype=np.int64)
    pos[slot_row, slot_col] = k
    weights = np.zeros((len(rows), t), dtype=np.float64)
    if reduction == "token_mean":
        weights[slot_row, slot_col] = 1.0 / float(n.sum())
    else:
        weights[slot_row, slot_col] = 1.0 / (n[slot_doc] * float(len(n)))
    return out, np.array(used, dtype=lengths.dtype) + 1, pos, weights


def _first_fit(
    sizes: list[int], order: list[int], shares: list[bool], room: int
) -> tuple[list[list[int]], list[int]]:
    """Documents of ``sizes`` predictions in rows of at most ``room`` inputs, each in turn of
    ``order`` into the first row it fits (one that does not share, alone): the rows'
    documents and inputs."""
    rows: list[list[int]] = []
    used: list[int] = []
    for doc in order:
        size = sizes[doc]
        fit = -1
        if shares[doc]:
            for r, u in enumerate(used):
                if u + size <= room and shares[rows[r][0]]:
                    fit = r
                    break
        if fit < 0:
            rows.append([doc])
            used.append(size)
        else:
            rows[fit].append(doc)
            used[fit] += size
    return rows, used


def padding(lengths: np.ndarray, block_size: int) -> tuple[int, int]:
    """``(computed, predicted)`` positions of rows ``lengths (B,)`` trimmed to the longest
    (the padding is ``1 - predicted / computed``); of a packed batch, given the lengths
    :func:`pack_batch` returns."""
    n = predicted(lengths, block_size)
    return len(lengths) * int(n.max()), int(n.sum())


#: The block size of a stream of text when no config says otherwise (the spec's 16).
TEXT_BLOCK_SIZE = 16


def check_text(text: Any, what: str) -> str:
    """``text`` if it is a string of at least two characters, else ``ArgumentTypeError`` or
    :class:`DataError` naming the argument ``what``."""
    if not isinstance(text, str):
        raise ArgumentTypeError(what, f"{what} must be a string, got {type(text).__name__}")
    if len(text) < 2:
        raise DataError(f"{what} holds {len(text)} characters; a stream needs at least 2", what)
    return text


def split_text(text: str, fraction: float) -> tuple[str, str]:
    """``(train, held_out)``: the last ``round(fraction * len(text))`` characters held out
    (as nanoGPT's last 10%); :class:`DataError` naming ``val_fraction`` unless ``0 < fraction
    < 1`` leaves two characters on each side."""
    _check_fraction(fraction, "val_fraction")
    cut = len(text) - round(fraction * len(text))
    if min(cut, len(text) - cut) < 2:
        raise DataError(
            f"holding out {fraction!r} of {len(text)} characters leaves a part shorter than "
            "2 characters",
            "val_fraction",
        )
    return text[:cut], text[cut:]


def encode_text(tokenizer: Tokenizer, text: str) -> np.ndarray:
    """The character ids ``(len(text),)`` int64 of ``text`` (no BOS); ``ValueError`` naming
    the first character not in the vocabulary and its position."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    table = np.frombuffer("".join(tokenizer.chars).encode("utf-32-le"), dtype="<u4")
    ids = np.minimum(np.searchsorted(table, codes), len(table) - 1)  # chars are sorted
    unknown = np.flatnonzero(table[ids] != codes)
    if len(unknown):
        i = int(unknown[0])
        raise ValueError(
            f"character {text[i]!r} at position {i} of the text is not in the tokenizer's "
            "vocabulary"
        )
    return ids.astype(np.int64)


def text_windows(
    num_tokens: int, block_size: int, batch_size: int, step: int, seed: int
) -> np.ndarray:
    """Start offsets ``(batch_size,)`` of step ``step``'s windows of ``block_size + 1``
    tokens in a stream of ``num_tokens``: uniform in ``[0, num_tokens - block_size - 1]``
    by ``numpy.random.default_rng([seed, step])`` (a resumed run draws the same)."""
    if num_tokens < block_size + 1:
        why = f"fewer than a window of block_size + 1 = {block_size + 1}"
        raise DataError(f"the text has {num_tokens} characters, {why}", "text")
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, num_tokens - block_size, size=batch_size, dtype=np.int64)


def eval_windows(num_tokens: int, block_size: int, max_tokens: int) -> np.ndarray:
    """Start offsets of the fixed held-out windows of ``block_size + 1`` tokens in a stream
    of ``num_tokens``: evenly spaced, end to end, predicting disjoint tokens, as many as fit
    but at most ``max_tokens // block_size`` (at least one, all of a shorter stream)."""
    room = num_tokens - 1 - block_size  # the last start
    k = max(1, min(room // block_size + 1, max_tokens // block_size))
    if k == 1:  # also a stream shorter than one window (room < 0)
        return np.zeros(1, dtype=np.int64)
    return np.arange(k, dtype=np.int64) * room // (k - 1)


def take_windows(
    ids: np.ndarray, starts: np.ndarray, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The batch ``(tokens (B, L), lengths (B,))`` of the windows of ``ids`` at ``starts``,
    ``L = min(block_size + 1, len(ids))``, every length ``L``."""
    width = min(block_size + 1, len(ids))
    tokens = ids[starts[:, None] + np.arange(width)]
    return tokens, np.full(len(starts), width, dtype=np.int64)


def held_out_rows(
    tokenizer: Tokenizer, text: str, block_size: int, max_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """A held-out stream as the batch ``(tokens (B, L), lengths (B,))`` of its fixed
    windows (:func:`eval_windows`): what training's held-out scoring and ``eval`` score."""
    ids = encode_text(tokenizer, text)
    return take_windows(ids, eval_windows(len(ids), block_size, max_tokens), block_size)


def take_batch(
    tokens: np.ndarray, lengths: np.ndarray, idx: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of an encoded corpus, trimmed to the longest of them."""
    lens = lengths[idx]
    return tokens[idx, : int(lens.max())], lens
