"""Training rows: generated stories (streamed from worker processes) mixed with prose windows.

    worker w (of n): seeds s0+w, s0+w+n, ... ─► training_document ─► tokenize ─► pack rows ─► queue
    main: each batch = rows from the queue + ``prose_fraction`` of rows cut at random from prose/*.train.npy

With ``workers=0`` stories are generated in the calling process instead.
A row is ``seq_len + 1`` token ids (inputs are ``row[:-1]``, targets ``row[1:]``);
documents are packed back to back with <|endoftext|> between them. Workers never import
torch and never touch a GPU, so they can be started before CUDA is initialised. Story seeds
stay below ``corpus.VALIDATION_SEED_BASE``; a resumed run starts its workers at a fresh
seed offset so no story is repeated.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue as queue_mod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
ROWS_PER_CHUNK = 32


def _story_chunks(tok, first_seed: int, seed_step: int, seq_len: int, chat_fraction: float):
    """Endless packed rows ``[ROWS_PER_CHUNK, seq_len + 1]`` (uint16) from stories first_seed, +seed_step, ..."""
    from training.stories import training_document

    width = seq_len + 1
    buf: list[int] = []
    seed = first_seed
    while True:
        docs = [training_document(seed + i * seed_step, chat_fraction) for i in range(64)]
        seed += 64 * seed_step
        for enc in tok.encode_batch(docs):
            buf.extend(enc.ids)
        while len(buf) >= ROWS_PER_CHUNK * width:
            yield np.asarray(buf[:ROWS_PER_CHUNK * width], dtype=np.uint16).reshape(ROWS_PER_CHUNK, width)
            del buf[:ROWS_PER_CHUNK * width]


def _story_worker(tokenizer_path: str, first_seed: int, seed_step: int, seq_len: int, chat_fraction: float,
                  out: mp.Queue, stop: mp.Event) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"   # one core per worker
    out.cancel_join_thread()                          # exit at once on stop, even with rows unsent
    from tokenizers import Tokenizer

    for chunk in _story_chunks(Tokenizer.from_file(tokenizer_path), first_seed, seed_step, seq_len, chat_fraction):
        while not stop.is_set():
            try:
                out.put(chunk, timeout=0.5)
                break
            except queue_mod.Full:
                continue
        if stop.is_set():
            return


@dataclass
class MixConfig:
    seq_len: int = 512
    batch_rows: int = 128
    prose_fraction: float = 0.15
    chat_fraction: float = 0.3
    workers: int = 4
    seed: int = 0
    first_story_seed: int = 0


class MixedBatches:
    """Iterator of uint16 arrays ``[batch_rows, seq_len + 1]``; call ``close()`` when done."""

    def __init__(self, data_dir: Path, cfg: MixConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.prose = {p.name.split(".")[0]: np.load(p) for p in sorted((data_dir / "prose").glob("*.train.npy"))}
        sizes = np.array([a.size for a in self.prose.values()], dtype=np.float64)
        self.prose_p = sizes / sizes.sum() if sizes.size else sizes
        ctx = mp.get_context("spawn")
        self.queue: mp.Queue = ctx.Queue(maxsize=256)
        self.stop = ctx.Event()
        self.local = None
        if cfg.workers == 0:   # generate in this process (tests, small CPU runs)
            from tokenizers import Tokenizer
            self.local = _story_chunks(Tokenizer.from_file(str(data_dir / "tokenizer" / "tokenizer.json")),
                                       cfg.first_story_seed, 1, cfg.seq_len, cfg.chat_fraction)
        self.procs = [
            ctx.Process(target=_story_worker, daemon=True, args=(
                str(data_dir / "tokenizer" / "tokenizer.json"), cfg.first_story_seed + w, cfg.workers,
                cfg.seq_len, cfg.chat_fraction, self.queue, self.stop))
            for w in range(cfg.workers)]
        for p in self.procs:
            p.start()
        self._pending = np.empty((0, cfg.seq_len + 1), dtype=np.uint16)
        self.rows_by_source = {"stories": 0, **{k: 0 for k in self.prose}}

    def _story_rows(self, n: int) -> np.ndarray:
        while self._pending.shape[0] < n:
            if self.local is not None:
                self._pending = np.concatenate([self._pending, next(self.local)])
                continue
            try:
                chunk = self.queue.get(timeout=120)
            except queue_mod.Empty as e:
                dead = [p.exitcode for p in self.procs if not p.is_alive()]
                raise RuntimeError(f"story workers produced nothing for 120 s (exit codes of dead ones: {dead})") from e
            self._pending = np.concatenate([self._pending, chunk])
        rows, self._pending = self._pending[:n], self._pending[n:]
        return rows

    def _prose_rows(self, n: int) -> np.ndarray:
        width = self.cfg.seq_len + 1
        names = list(self.prose)
        picks = self.rng.choice(len(names), size=n, p=self.prose_p)
        rows = np.empty((n, width), dtype=np.uint16)
        for i, k in enumerate(picks):
            arr = self.prose[names[k]]
            start = int(self.rng.integers(0, arr.size - width))
            rows[i] = arr[start:start + width]
            self.rows_by_source[names[k]] += 1
        return rows

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        n_prose = int(self.rng.binomial(self.cfg.batch_rows, self.cfg.prose_fraction)) if self.prose else 0
        rows = np.concatenate([self._story_rows(self.cfg.batch_rows - n_prose), self._prose_rows(n_prose)])
        self.rows_by_source["stories"] += self.cfg.batch_rows - n_prose
        return rows[self.rng.permutation(rows.shape[0])]

    def close(self) -> None:
        self.stop.set()
        try:
            while True:
                self.queue.get_nowait()
        except queue_mod.Empty:
            pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
