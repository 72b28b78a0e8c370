"""Stop and bad words of a request: bounded when parsed, matched against the output in time linear
in the tokens generated (an Aho-Corasick automaton over token ids), whatever the number of words.

    m = WordMatcher([(7, 8), (9,)])
    m.push(5) -> None;  m.push(7) -> None;  m.push(8) -> 0   (index of the word that ends at this token)
    OutputWatch(request).push(tokens)        a request's output rules (end_id, stop and bad words) applied
"""
from __future__ import annotations

from typing import Sequence

MAX_WORDS = 1024                       # words in one stop_words or bad_words input
MAX_WORDS_BYTES = 64 << 10             # their UTF-8 bytes together


def check_word_bounds(name: str, raw: Sequence) -> None:
    """Refuse, before any word is decoded or tokenized, more than MAX_WORDS words or more than
    MAX_WORDS_BYTES bytes of them in input `name` (ValueError naming the input and the numbers)."""
    if len(raw) > MAX_WORDS:
        raise ValueError(f"input {name!r} holds {len(raw)} words; at most {MAX_WORDS} are accepted")
    size = 0
    for w in raw:
        size += len(w) if isinstance(w, bytes) else len(str(w).encode("utf-8", "surrogatepass"))
        if size > MAX_WORDS_BYTES:
            raise ValueError(f"input {name!r} holds over {MAX_WORDS_BYTES} bytes of words; at most "
                             f"{MAX_WORDS_BYTES} are accepted")


class WordMatcher:
    """Which word, if any, ends at each token pushed: an Aho-Corasick automaton over token ids.
    Building it is linear in the words' total length; push() is amortized O(1) per token (a
    failure link is followed at most as often as a goto edge was), so matching is linear in the
    output whatever the number of words. When several words end at one token, the shortest one
    is reported."""

    def __init__(self, words: Sequence[Sequence[int]]):
        self.goto: list[dict[int, int]] = [{}]
        self.ends: list[int | None] = [None]       # node -> index of the shortest word ending here (with links)
        for index, word in enumerate(words):
            node = 0
            for t in word:
                nxt = self.goto[node].get(t)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[node][t] = nxt
                    self.goto.append({})
                    self.ends.append(None)
                node = nxt
            if self.ends[node] is None:
                self.ends[node] = index
        self.lengths = [len(w) for w in words]
        self.fail = [0] * len(self.goto)
        order = list(self.goto[0].values())         # breadth first: a node's link is set before its children's
        for node in order:
            for t, child in self.goto[node].items():
                link = self.fail[node]
                while link and t not in self.goto[link]:
                    link = self.fail[link]
                target = self.goto[link].get(t, 0)
                self.fail[child] = target if target != child else 0
                order.append(child)
            link_end = self.ends[self.fail[node]]
            if link_end is not None and (self.ends[node] is None
                                         or self.lengths[link_end] < self.lengths[self.ends[node]]):
                self.ends[node] = link_end
        self.state = 0

    def push(self, token: int) -> int | None:
        """Advance by one output token -> the index of a word that ends here, or None."""
        node = self.state
        while node and token not in self.goto[node]:
            node = self.fail[node]
        self.state = self.goto[node].get(token, 0)
        return self.ends[self.state]


class OutputWatch:
    """Applies a request's output rules to the tokens the executor streams, one token at a time:
      - end_id (req.stop_ids) before min_length tokens: refused (greedy decoding chose end_id there;
        honouring min_length would take the runner-up token, which needs logit masking);
      - a bad word completed by the next token: refused at that token (banning it needs logit masking);
      - a stop word completed: the output ends after it (the stop word is part of the output).
    Tokens before the point of refusal are exact, so they are kept. Words are matched by
    WordMatcher automata: each token costs the same however many words the request has.
    push(chunk) -> (tokens to emit, end): end is None (go on), "stop", or an error message.

    req: request_parsing.GenerateRequest (stop_ids, min_length, stop_words, bad_words).

    Example: stop_words ((7, 8),), chunk [5, 7, 8, 9] -> ([5, 7, 8], "stop")."""

    def __init__(self, req):
        self.req = req
        self.out: list[int] = []
        self._stop = WordMatcher(req.stop_words) if req.stop_words else None
        self._bad = WordMatcher([ids for _, ids in req.bad_words]) if req.bad_words else None

    def push(self, chunk: Sequence[int]) -> tuple[list[int], str | None]:
        keep: list[int] = []
        for t in chunk:
            i = len(self.out)
            if t in self.req.stop_ids and i < self.req.min_length:
                return keep, (f"min_length={self.req.min_length}: greedy decoding reaches end_id {t} after "
                              f"{i} tokens, and this model cannot hold end_id back (the reference executor "
                              "has no logit masking); lower min_length or send end_id -1")
            bad = self._bad.push(t) if self._bad is not None else None
            if bad is not None:
                word, ids = self.req.bad_words[bad]
                return keep, (f"bad_words: greedy decoding produces {word!r} at output token {i - len(ids) + 1}, "
                              "and this model cannot ban tokens (the reference executor has no logit masking)")
            self.out.append(t)
            keep.append(t)
            if self._stop is not None and self._stop.push(t) is not None:
                return keep, "stop"
        return keep, None
