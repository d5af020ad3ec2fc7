"""Hints that are answer tables: the candidate replies a hint holds for what an observation shows.

A fixed hint cannot hold one answer per seed, but it can hold a table: "Vault 7: marmalade,
Vault 8: quince, ...", "red -> apple, blue -> plum", "item K-17 takes code 4412". The env draws a
key from the seed, shows it, and rewards the entry's value; the hinted agent looks the key up,
the unhinted one can only guess, and hint-regret is +1 with nothing to learn that transfers.
``Table(hint).candidates(obs)`` reads such a hint the way a lookup would, without knowing its
format:

* the hint is cut into entries at three grains: items (split at commas, semicolons, sentence
  ends and line breaks), sentences, and lines;
* a *key* is a word of the observation that occurs in exactly one entry of a grain with at least
  two entries (a word every entry shares, like "Vault", is structure, not a key), and that not
  every seed shows (``fixed``: the words of the frame, "Item ... at the gate", are not the key the
  seed drew);
* the candidates are what that entry says besides the key: its quoted strings, the rest of the
  entry after the key, then its other words, those after the key first and nearest first,
  skipping words the observation shows and words shared by half the entries or more;
* a word list keyed by position ("the words of vaults 1 to 9 are: amber, basil, ...") gives its
  n-th item for a number n the observation shows.

The probe that plays these candidates per seed, and the check that a miss teaches the player
nothing, live in ``stages/validate_keyed.py`` (docs/regret.md, "Answer tables").

    Table("Vault 7: marmalade, Vault 8: quince").candidates("Vault 8 is locked.")  # ['quince']
"""

from __future__ import annotations

import re

WORD = re.compile(r"[A-Za-z0-9]+(?:[-_'][A-Za-z0-9]+)*")
QUOTED = re.compile(r"'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"|`([^`\n]{1,80})`")
ITEM_SPLIT = re.compile(r"[,;\n]|(?<=[.!?])\s+")
SENTENCE_SPLIT = re.compile(r"[;\n]|(?<=[.!?])\s+")
LEAD = re.compile(r"^[\s:=>\-\u2192,]*(?:(?:is|are|and|or|to|means|says|gives|takes|opens|wants|needs)\b[\s:=>\-]*)?",
                  re.I)
MAX_CANDIDATES = 6
MAX_INDEX = 64


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


class Table:
    """The hint cut into entries at each grain, with each word's entry count per grain."""

    def __init__(self, hint: str, fixed: set[str] = frozenset()) -> None:
        self.hint = hint or ""
        self.fixed = {w.lower() for w in fixed}  # words every seed shows: the frame, not a key
        self.grains: list[tuple[list[str], list[set[str]], dict[str, int]]] = []
        for split in (ITEM_SPLIT, SENTENCE_SPLIT, re.compile(r"\n")):
            entries = [e.strip() for e in split.split(self.hint) if e and e.strip() and words(e)]
            if len(entries) < 2:
                continue
            sets = [set(words(e)) for e in entries]
            count: dict[str, int] = {}
            for s in sets:
                for w in s:
                    count[w] = count.get(w, 0) + 1
            self.grains.append((entries, sets, count))
        self.lists = self._lists()

    def _lists(self) -> list[list[str]]:
        """Runs of at least three one-word items after a colon: lists a position can index."""
        out = []
        for part in self.hint.split(":")[1:]:
            run = []
            for item in re.split(r"[,;]|\band\b", part.split("\n")[0]):
                ws = WORD.findall(item)
                if len(ws) != 1:
                    break
                run.append(ws[0])
            if len(run) >= 3:
                out.append(run)
        return out

    @property
    def usable(self) -> bool:
        return bool(self.grains or self.lists)

    def candidates(self, obs: str | set[str]) -> list[str]:
        """Replies the hint keys to what ``obs`` shows (its text, or its ``words`` as a set), most
        likely first (at most MAX_CANDIDATES)."""
        shown = obs if isinstance(obs, set) else set(words(obs))
        out: list[str] = []
        for entries, sets, count in self.grains:
            for entry, ws in zip(entries, sets, strict=True):
                keys = [w for w in ws & shown - self.fixed if count[w] == 1]
                if keys:
                    out += self._from_entry(entry, keys, shown, count, len(entries))
        for run in self.lists:
            for w in shown:
                if w.isdigit() and 0 < int(w) <= min(len(run), MAX_INDEX):
                    out += [run[int(w) - 1], *run[int(w):int(w) + 1]]
        seen: list[str] = []
        for c in out:
            c = c.strip().strip(".,;:!?")
            if c and c.lower() not in shown and c not in seen:
                seen.append(c)
        return seen[:MAX_CANDIDATES]

    @staticmethod
    def _from_entry(entry: str, keys: list[str], shown: set[str], count: dict[str, int], n: int) -> list[str]:
        found = [next(g for g in m.groups() if g) for m in QUOTED.finditer(entry)]
        tokens = list(WORD.finditer(entry))
        at = [i for i, m in enumerate(tokens) if m.group().lower() in keys]
        if not at:
            return found
        k = max(at)
        rest = LEAD.sub("", entry[tokens[k].end():]).strip()
        if 1 < len(words(rest)) <= 3:
            found.append(rest)
        order = sorted((i for i in range(len(tokens)) if i not in at), key=lambda i: (i < k, abs(i - k)))
        for i in order:
            w = tokens[i].group()
            c = count.get(w.lower(), 0)
            if w.lower() not in shown and (c <= 1 or c < n / 2):  # in half the entries: structure
                found.append(w)
        return found
