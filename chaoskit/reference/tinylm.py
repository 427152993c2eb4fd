"""tiny_lm: a small numpy decoder generating byte tokens step by step over a paged KV cache in a fixed pool.

The KV pool is real memory (one float32 array sized by `memory_budget`) split into blocks of `block_tokens`
tokens. What the seed's incident needs is real here:
- `isolate_kv_cache: true`: a finished request's blocks are cleared and freed at once, and long-context
  requests allocate from the top of the pool, short ones from the bottom, so they never interleave.
- `isolate_kv_cache: false`: finished requests leave their blocks as *residue* that is not reset: the next
  short request reuses the largest residue extent (if it fits) as is and inherits its stale keys/values and
  length, so a short request after a long one attends over the long context's leftovers (slower, and
  polluted); a long-context request allocates fresh blocks beside the residue. (Reuse by the newest extent,
  and by long requests too, made the outcome hang on the order requests finished inside a batch, which follows
  host speed: the kv-cache-pollution scenario held on a slower host.) Residue
  not reused is reclaimed lazily (after `residue_ttl_s`, or, with `cache_eviction_policy: lru`, oldest first
  when an allocation needs room); it keeps the pool looking full and fragmented.
- `cache_eviction_policy: none` never evicts residue to make room: when free blocks run out the request
  fails like an OOM on a GPU does.
- `batching_fallback_fragmentation` (the seed's shipped fix, off by default): when a batch arrives while the
  pool's fragmentation is above the threshold, it is not admitted at once (dynamic batching) but run as
  consecutive static sub-batches, each as many of its requests as fit the pool now, run to completion and
  released before the next is admitted: requests that would have failed with KVCacheOOM wait instead.
"""

from __future__ import annotations

import io
import mmap
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FREE, USED, RESIDUE = 0, 1, 2
ALIGN = 4096
WEIGHTS_FILE = "weights.npz"


class KVCacheOOM(MemoryError):
    """The pool cannot hold the request's cache (the CPU stand-in for a CUDA out-of-memory error)."""


@dataclass
class Seq:
    """One request's sequence: its tokens and the pool blocks holding its keys and values."""

    tokens: list[int]
    max_new: int
    blocks: list[int]
    long: bool
    stale: int = 0  # leftover positions of a previous owner at the start of the blocks (attended over too)
    length: int = 0  # positions whose K/V are in the cache (stale ones included)
    out: list[int] = field(default_factory=list)


class KVPool:
    def __init__(self, budget_bytes: int, layers: int, dim: int, block_tokens: int = 16, isolate: bool = True,
                 eviction: str = "none", residue_ttl_s: float = 5.0):
        self.block_tokens, self.isolate, self.eviction, self.residue_ttl_s = block_tokens, isolate, eviction, residue_ttl_s
        per_block = layers * 2 * block_tokens * dim * 4
        self.n = max(8, budget_bytes // per_block)
        self.data = np.zeros((self.n, layers, 2, block_tokens, dim), np.float32)
        self.state = np.zeros(self.n, np.int8)
        self.born = np.zeros(self.n)  # when each block was last allocated
        self.ooms = 0
        self.residue: deque[tuple[float, np.ndarray, int]] = deque()  # (released at, blocks, length) per request

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    # -- allocation ---------------------------------------------------------------------------------

    def allocate(self, nblocks: int, long: bool, ntokens: int) -> tuple[list[int], int]:
        """Blocks for `ntokens` new positions, and how many stale positions they start with."""
        if not self.isolate and not long and self.residue:  # the largest residue extent (newest of equals), as is
            i = max(range(len(self.residue)), key=lambda j: (len(self.residue[j][1]), j))
            _, blocks, length = self.residue[i]
            room = len(blocks) * self.block_tokens
            if room >= ntokens:
                del self.residue[i]
                self.state[blocks] = USED
                return [int(b) for b in blocks], min(length, room - ntokens)
        free = np.flatnonzero(self.state == FREE)
        if len(free) < nblocks and self.eviction == "lru":
            self._reclaim(nblocks - len(free))
            free = np.flatnonzero(self.state == FREE)
        if len(free) < nblocks:
            self.ooms += 1
            raise KVCacheOOM(f"out of memory: KV cache needs {nblocks} blocks, {len(free)} free, "
                             f"{int((self.state == RESIDUE).sum())} held by residue, pool {self.n} blocks "
                             f"({self.nbytes / 2**20:.0f} MiB)")
        chosen = free[-nblocks:][::-1] if (self.isolate and long) else free[:nblocks]
        now = time.monotonic()
        self.state[chosen] = USED
        self.born[chosen] = now
        return [int(b) for b in chosen], 0

    def fits(self, nblocks: int, ntokens: int) -> bool:
        """Whether `allocate(nblocks, _, ntokens)` would succeed now (it changes nothing)."""
        if not self.isolate and any(len(b) * self.block_tokens >= ntokens for _, b, _ in self.residue):
            return True
        room = int((self.state == FREE).sum())
        if self.eviction == "lru":
            room += sum(len(b) for _, b, _ in self.residue)
        return room >= nblocks

    def release(self, blocks: list[int], length: int) -> None:
        now = time.monotonic()
        if self.isolate:
            self._clear(np.asarray(blocks, dtype=np.int64))
        else:
            self.state[blocks] = RESIDUE
            self.residue.append((now, np.asarray(blocks, dtype=np.int64), length))

    def sweep(self) -> None:
        """Lazy reclamation of residue older than residue_ttl_s (runs on the request path, like real GC)."""
        limit = time.monotonic() - self.residue_ttl_s
        while self.residue and self.residue[0][0] < limit:
            self._clear(self.residue.popleft()[1])

    def _reclaim(self, need: int) -> None:
        """LRU: clear whole residues of finished requests, oldest first, until `need` blocks are free."""
        freed = 0
        while self.residue and freed < need:
            blocks = self.residue.popleft()[1]
            self._clear(blocks)
            freed += len(blocks)

    def _clear(self, blocks: np.ndarray) -> None:
        self.data[blocks] = 0.0  # really touch the memory, as a reset of freed cache does
        self.state[blocks] = FREE

    # -- reading and writing ------------------------------------------------------------------------

    def write(self, seq: Seq, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store K/V rows (n x dim) for positions pos.. of the sequence."""
        where = np.arange(pos, pos + len(k))
        blocks = np.asarray(seq.blocks)[where // self.block_tokens]
        offsets = where % self.block_tokens
        self.data[blocks, layer, 0, offsets] = k
        self.data[blocks, layer, 1, offsets] = v

    def read(self, seq: Seq, layer: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of the first `length` positions; one view per contiguous run of blocks (scattered = copies)."""
        nb = -(-length // self.block_tokens)
        runs, start = [], 0
        blocks = seq.blocks[:nb]
        for i in range(1, nb + 1):
            if i == nb or blocks[i] != blocks[i - 1] + 1:
                a, b = blocks[start], blocks[i - 1]
                runs.append(self.data[a:b + 1, layer] if a <= b else self.data[b:a + 1, layer][::-1])
                start = i
        kv = runs[0] if len(runs) == 1 else np.concatenate(runs)
        kv = kv.transpose(1, 0, 2, 3).reshape(2, -1, kv.shape[-1])
        return kv[0, :length], kv[1, :length]

    # -- metrics --------------------------------------------------------------------------------------

    def usage(self) -> float:
        return float((self.state != FREE).sum()) / self.n

    def fragmentation(self) -> float:
        """Share of the pool not held by live requests that is not one contiguous free run: residue plus
        scattered holes (0 = everything not in use is one clean run; 1 = none of it is)."""
        free = self.state == FREE
        available = int((self.state != USED).sum())
        if available == 0:
            return 0.0
        longest = 0
        if free.any():
            edges = np.flatnonzero(np.diff(np.concatenate(([0], free.astype(np.int8), [0]))))
            longest = int((edges[1::2] - edges[0::2]).max())
        return 1.0 - longest / available

    def mean_residency_s(self) -> float:
        """Mean age of the blocks resident now (live or residue) since they were allocated."""
        resident = self.state != FREE
        return float((time.monotonic() - self.born[resident]).mean()) if resident.any() else 0.0


def init_weights(dim: int = 64, layers: int = 4, vocab: int = 256, seed: int = 0) -> dict[str, np.ndarray]:
    """Random fixed weights (per-layer matrices stacked on a leading layer axis)."""
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(dim)

    def mat(*shape: int, scale: float = s) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {"embed": mat(vocab, dim, scale=1.0), "pos": mat(8192 + 64, dim, scale=0.1),
            "wqkv": mat(layers, dim, 3 * dim), "wo": mat(layers, dim, dim), "w1": mat(layers, dim, 4 * dim),
            "w2": mat(layers, 4 * dim, dim, scale=s * 0.5), "unembed": mat(dim, vocab)}


def save_weights(path: Path, weights: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **weights)


def load_weights(path: Path) -> dict[str, np.ndarray]:
    """Read the weights file with O_DIRECT, as servers hot-loading weights do (so a throttled or slow disk
    shows in load time, not hidden by the page cache); plain reads where the filesystem refuses O_DIRECT."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return dict(np.load(path))
    try:
        size = os.fstat(fd).st_size
        buf = mmap.mmap(-1, max(ALIGN, -(-size // ALIGN) * ALIGN))  # page-aligned, as O_DIRECT needs
        view, off = memoryview(buf), 0
        try:
            while off < size:
                n = os.preadv(fd, [view[off:off + (1 << 20)]], off)
                if n <= 0:
                    break
                off += n
        except OSError:  # EINVAL: this filesystem takes O_DIRECT at open but not for reads
            return dict(np.load(path))
        return dict(np.load(io.BytesIO(bytes(view[:size]))))
    finally:
        os.close(fd)


def parse_fallback(value: str | float | None) -> float | None:
    """`batching_fallback_fragmentation`: "" / "none" / "off" = no fallback, else a ratio in [0, 1)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off", "false")):
        return None
    threshold = float(value)
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"batching_fallback_fragmentation must be in [0, 1) or none (got {value!r})")
    return threshold


class TinyLM:
    """A 4-layer single-head decoder over bytes: real matmuls, real attention, over the paged KV pool."""

    def __init__(self, weights: dict[str, np.ndarray] | None = None,
                 batching_fallback_fragmentation: str | float | None = None, **pool_kw):
        self.fallback_fragmentation = parse_fallback(batching_fallback_fragmentation)
        self.fallbacks = 0  # batches run as static sub-batches because fragmentation was over the threshold
        self.last_path, self.last_groups = "dynamic", 0  # how the last batch was admitted, in how many groups
        w = weights if weights is not None else init_weights()
        self.embed, self.pos, self.unembed = w["embed"], w["pos"], w["unembed"]
        self.wqkv, self.wo, self.w1, self.w2 = w["wqkv"], w["wo"], w["w1"], w["w2"]
        self.vocab, self.dim = self.embed.shape
        self.layers = len(self.wqkv)
        self.pool = KVPool(layers=self.layers, dim=self.dim, **pool_kw)
        self.long_context_tokens = 512

    @staticmethod
    def _tokens(prompt: bytes, max_new: int) -> list[int]:
        return list(prompt[:8192 - max_new - 1]) or [0]

    def start(self, prompt: bytes, max_new: int) -> Seq:
        tokens = self._tokens(prompt, max_new)
        total = len(tokens) + max_new
        long = total > self.long_context_tokens
        blocks, stale = self.pool.allocate(-(-total // self.pool.block_tokens), long, total)
        return Seq(tokens, max_new, blocks, long, stale=stale, length=stale)

    def fits(self, prompt: bytes, max_new: int) -> bool:
        total = len(self._tokens(prompt, max_new)) + max_new
        return self.pool.fits(-(-total // self.pool.block_tokens), total)

    def _start_or_oom(self, prompt: bytes, max_new: int) -> Seq | KVCacheOOM:
        try:
            return self.start(prompt, max_new)
        except KVCacheOOM as e:
            return e

    def admit(self, prompts: list[tuple[bytes, int]]) -> Iterator[list[tuple[int, Seq | KVCacheOOM]]]:
        """Admission of one batch, as groups of (index, started sequence or the OOM that failed it). The caller
        runs each group to completion and `finish()`es its sequences before asking for the next group.

        Dynamic batching (the default): one group, every request admitted at once; those the pool cannot hold
        fail. With `batching_fallback_fragmentation` set and the pool's fragmentation above it when the batch
        arrives (and more than one request): static sub-batches in arrival order, each cut before the first
        request that no longer fits, so a request fails only if it does not fit even alone."""
        self.pool.sweep()
        threshold = self.fallback_fragmentation
        if threshold is None or len(prompts) < 2 or self.pool.fragmentation() <= threshold:
            self.last_path, self.last_groups = "dynamic", 1
            yield [(i, self._start_or_oom(p, n)) for i, (p, n) in enumerate(prompts)]
            return
        self.fallbacks += 1
        self.last_path, self.last_groups = "static", 0
        group: list[tuple[int, Seq | KVCacheOOM]] = []
        for i, (p, n) in enumerate(prompts):
            if any(isinstance(s, Seq) for _, s in group) and not self.fits(p, n):
                self.last_groups += 1
                yield group
                group = []
                self.pool.sweep()
            group.append((i, self._start_or_oom(p, n)))
        if group:
            self.last_groups += 1
            yield group

    def finish(self, seq: Seq) -> None:
        self.pool.release(seq.blocks, seq.length)

    @staticmethod
    def _norm(x: np.ndarray) -> np.ndarray:
        return x / (np.sqrt((x * x).mean(-1, keepdims=True)) + 1e-5)

    def prefill(self, seq: Seq) -> None:
        """Run the prompt (all but its last token) through every layer, filling the cache."""
        toks = seq.tokens[:-1]
        if not toks:
            return
        n, start = len(toks), seq.stale
        x = self.embed[toks] + self.pos[start:start + n]
        mask = np.triu(np.full((n, start + n), -1e9, np.float32), start + 1)
        for layer in range(self.layers):
            h = self._norm(x)
            q, k, v = np.split(h @ self.wqkv[layer], 3, axis=-1)
            self.pool.write(seq, layer, start, k, v)
            if start:
                k, v = self.pool.read(seq, layer, start + n)
            att = q @ k.T / np.sqrt(self.dim) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            x = x + (att @ v) @ self.wo[layer]
            x = x + np.maximum(self._norm(x) @ self.w1[layer], 0) @ self.w2[layer]
        seq.length = start + n

    def step(self, seqs: list[Seq]) -> list[int]:
        """One decode step for a batch: each sequence's last token in, one new token out (greedy)."""
        last = [s.out[-1] if s.out else s.tokens[-1] for s in seqs]
        x = self.embed[last] + self.pos[[s.length for s in seqs]]
        for layer in range(self.layers):
            h = self._norm(x)
            qkv = h @ self.wqkv[layer]
            q, k, v = np.split(qkv, 3, axis=-1)
            ctx = np.empty_like(q)
            for i, s in enumerate(seqs):
                self.pool.write(s, layer, s.length, k[i:i + 1], v[i:i + 1])
                keys, vals = self.pool.read(s, layer, s.length + 1)
                att = keys @ q[i] / np.sqrt(self.dim)
                att = np.exp(att - att.max())
                ctx[i] = (att / att.sum()) @ vals
            x = x + ctx @ self.wo[layer]
            x = x + np.maximum(self._norm(x) @ self.w1[layer], 0) @ self.w2[layer]
        nxt = (self._norm(x) @ self.unembed).argmax(-1)
        for s, t in zip(seqs, nxt, strict=True):
            s.length += 1
            s.out.append(int(t))
        return [int(t) for t in nxt]

    def generate(self, prompts: list[tuple[bytes, int]]) -> list[bytes | KVCacheOOM]:
        """Whole requests (the non-streaming path): outputs as bytes, or the OOM that failed a request."""
        results: list[bytes | KVCacheOOM] = [b""] * len(prompts)
        for group in self.admit(prompts):
            seqs = []
            for i, s in group:
                if isinstance(s, KVCacheOOM):
                    results[i] = s
                else:
                    seqs.append((i, s))
            for _, s in seqs:
                self.prefill(s)
            active = [s for _, s in seqs]
            while active:
                self.step(active)
                active = [s for s in active if len(s.out) < s.max_new]
            for i, s in seqs:
                results[i] = bytes(t % 256 for t in s.out)
                self.finish(s)
        return results
