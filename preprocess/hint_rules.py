"""The BET(SG) hint of every decoder input position, from a dependency tree over BPE pieces.

docs/method.md, Eq. (17): position t (which predicts token t+1) points at the nearest ancestor of token
t+1 in the dependency tree that stands to its left; if there is none, at t itself.

fairseq's decoder input is ``[eos, y_1 .. y_n]`` and its target ``[y_1 .. y_n, eos]``, so there are
``n + 1`` positions: position 0 (the input eos) predicts y_1, position t predicts y_{t+1}, and
position n predicts the final eos. Token y_k sits at input position k. The parser sees *words*
(BPE pieces joined); this module maps its word tree back onto the pieces:

* A word's position is its **last piece** (the piece that has read the whole word): a hint that
  points at word a points at the input position of a's last piece. Every piece of an ancestor to
  the left of a word lies left of the word's first piece, so the hint is always <= t (causal).
* Pieces of one word (``subword_policy``):
  ``word`` (default): every piece of a word has the word's hint (its nearest left ancestor's last
  piece; t itself where the word has none), so the whole word is predicted from its syntactic head;
  ``previous-piece``: a non-first piece points at the previous piece of its own word (which is
  position t itself: the piece is read as a dependent of the piece before it).
* The final eos: treated as a dependent of the root of the last sentence on the line (the root is
  an ancestor standing left of eos), so position n points at that root's last piece.
* An empty line (n = 0) has the single hint [0].
"""

from typing import List, Sequence, Tuple

SUBWORD_POLICIES = ("word", "previous-piece")
BPE_MARKER = "@@"


def split_bpe(line: str, marker: str = BPE_MARKER) -> Tuple[List[str], List[int]]:
    """subword-nmt pieces -> (words, number of pieces of each word). ``"walk@@ ing"`` = one word."""
    words, pieces = [], []
    current, count = "", 0
    for piece in line.split():
        count += 1
        if piece.endswith(marker) and len(piece) > len(marker):
            current += piece[: -len(marker)]
            continue
        words.append(current + piece)
        pieces.append(count)
        current, count = "", 0
    if count:  # a line ending in a "@@" piece: close the word
        words.append(current)
        pieces.append(count)
    return words, pieces


def left_ancestors(heads: Sequence[int]) -> List[int]:
    """For each word, its nearest ancestor with a smaller index, or -1. ``heads[i] == i`` is a root."""
    result = []
    for i in range(len(heads)):
        j, seen = i, 0
        found = -1
        while heads[j] != j:
            j = heads[j]
            seen += 1
            if seen > len(heads):
                raise ValueError(f"dependency heads {list(heads)} contain a cycle")
            if j < i:
                found = j
                break
        result.append(found)
    return result


def root_of(heads: Sequence[int], i: int) -> int:
    while heads[i] != i:
        i = heads[i]
    return i


def position_hints(heads: Sequence[int], pieces_per_word: Sequence[int], subword_policy: str = "word") -> List[int]:
    """Hints for the n + 1 decoder input positions of a line of ``sum(pieces_per_word)`` tokens."""
    if subword_policy not in SUBWORD_POLICIES:
        raise ValueError(f"unknown subword policy {subword_policy!r}; choose one of {', '.join(SUBWORD_POLICIES)}")
    if len(heads) != len(pieces_per_word):
        raise ValueError(f"{len(heads)} parsed words but {len(pieces_per_word)} words in the line")
    last_piece, first_piece = [], []  # 1-based token positions = decoder input positions
    k = 0
    for count in pieces_per_word:
        first_piece.append(k + 1)
        k += count
        last_piece.append(k)
    n = k
    if n == 0:
        return [0]
    ancestors = left_ancestors(heads)
    hints = []
    for w, count in enumerate(pieces_per_word):
        a = ancestors[w]
        for p in range(count):
            t = first_piece[w] + p - 1  # the position that predicts this piece
            if p > 0 and subword_policy == "previous-piece":
                hints.append(t)
            else:
                hints.append(last_piece[a] if a >= 0 else t)
    hints.append(last_piece[root_of(heads, len(heads) - 1)])  # position n predicts eos
    return hints


def doc_hints(doc, pieces_per_word: Sequence[int], subword_policy: str = "word") -> List[int]:
    """Hints from a parsed spaCy Doc whose tokens are the line's words."""
    return position_hints([tok.head.i for tok in doc], pieces_per_word, subword_policy)
