"""What to copy: a notebook's last cell, the lines of the tricks that helped in this run, ready to paste.

    verdicts.add("channels_last", cmp, "when ...", copy="model = model.to(memory_format=torch.channels_last)")
    verdicts.what_to_copy()   # the lines of every trick that helped here, then the ones that did not, and why

Which list a trick lands on is read from this run: a row read from a comparison helped when its outcome is
faster; any other row says so itself (``helped=``, a bool the notebook computed, e.g. the bytes it saved). The
lines are the trick's own lines as its section ran them; ``tests/project/test_trick_cells.py`` checks that every
stored line appears in a code cell of the notebook, so what a reader pastes is what was checked and measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CopyItem", "CopyList", "copy_list"]


@dataclass(frozen=True)
class CopyItem:
    """One trick on the copy list: its lines, what this run measured, and (when it did not help) why not."""

    trick: str
    lines: str  # the trick's own lines, as its section ran them
    measured: str  # the closing row's text, with its cells before the verdict (e.g. the memory it saved)
    caveat: str  # when the trick does not help (a fixed fact)
    helped: bool

    def to_dict(self) -> dict:
        return {"trick": self.trick, "lines": self.lines, "measured": self.measured, "helped": self.helped}


@dataclass(frozen=True)
class CopyList:
    """The tricks of one closing table that carry lines to copy, split by whether they helped in this run."""

    items: tuple[CopyItem, ...]

    def __post_init__(self):
        if not isinstance(self.items, tuple) or not all(isinstance(i, CopyItem) for i in self.items):
            raise TypeError("items must be a tuple of CopyItem")
        if not self.items:
            raise ValueError("a copy list needs at least one trick: pass copy='...' to VerdictTable.add")

    @property
    def helped(self) -> tuple[CopyItem, ...]:
        return tuple(i for i in self.items if i.helped)

    @property
    def not_helped(self) -> tuple[CopyItem, ...]:
        return tuple(i for i in self.items if not i.helped)

    def code(self) -> str:
        """The lines of every trick that helped, each under a comment that says what it measured here."""
        return "\n\n".join(f"# {i.trick}: {i.measured}\n{i.lines}" for i in self.helped)

    def to_markdown(self) -> str:
        parts = []
        if self.helped:
            parts += [
                f"**Helped on this machine ({len(self.helped)} of {len(self.items)})**: the lines to paste, "
                "as their sections ran and checked them.",
                f"```python\n{self.code()}\n```",
            ]
        else:
            parts.append(f"**None of the {len(self.items)} tricks below helped on this machine.**")
        if self.not_helped:
            parts.append("**Did not help here**, and why:")
            parts.append(
                "\n".join(f"- **{i.trick}**: {i.measured} (when it does not help: {i.caveat})" for i in self.not_helped)
            )
        return "\n\n".join(parts)

    # The items go with the output as metadata, so a test can check every stored line against the notebook's code.
    def _repr_markdown_(self) -> tuple[str, dict]:
        return self.to_markdown(), {"tricks_lib": {"what_to_copy": [i.to_dict() for i in self.items]}}

    def __repr__(self) -> str:
        return self.to_markdown()


def copy_list(rows: Sequence) -> CopyList:
    """The copy list of verdict rows: every row with lines to copy, in the table's order."""
    return CopyList(tuple(CopyItem(r.trick, r.copy, r.text, r.caveat, bool(r.helped)) for r in rows if r.copy))
