"""A report laid out in pages, with matplotlib alone (already the reports' plotting library): a title, paragraphs,
tables and images flowing down A4 or Letter pages, each page numbered "page N of M". The fleet report's PDF is the
same report as its HTML page, not a text dump.

The layout is a list of blocks, each of a known height, placed top to bottom; a block that does not fit the rest of a
page starts the next one (a table longer than a page is split between rows). Sizes are in inches.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

PAPERS = {"a4": (8.27, 11.69), "letter": (8.5, 11.0)}
MARGIN = 0.75
LINE = 0.19  # the height of a line of 10 pt text
CHARS_PER_INCH = 14.5  # 10 pt sans-serif (DejaVu Sans, matplotlib's), for wrapping a paragraph to the page's width
ROW = 0.22

Draw = Callable[[Any, float], None]  # (figure, the block's top in inches from the page's top) -> None


@dataclass
class Block:
    height: float
    draw: Draw
    keep_with_next: bool = False  # a heading: never last on a page


@dataclass
class Document:
    paper: str = "a4"
    blocks: list[Block] = field(default_factory=list)

    @property
    def size(self) -> tuple[float, float]:
        return PAPERS[self.paper]

    @property
    def width(self) -> float:
        return self.size[0] - 2 * MARGIN

    def title(self, text: str) -> None:
        self.blocks.append(Block(0.5, lambda fig, top: self.text(fig, top, text, 18, "bold"), keep_with_next=True))

    def heading(self, text: str) -> None:
        self.blocks.append(
            Block(0.4, lambda fig, top: self.text(fig, top + 0.1, text, 13, "bold"), keep_with_next=True)
        )

    def paragraph(self, text: str, bullet: bool = False) -> None:
        width = int(self.width * CHARS_PER_INCH) - (3 if bullet else 0)
        lines = textwrap.wrap(text, width) or [""]
        if bullet:
            lines = ["•  " + lines[0], *("    " + line for line in lines[1:])]
        self.blocks.append(Block(LINE * len(lines) + 0.08, lambda fig, top: self.text(fig, top, "\n".join(lines), 10)))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        """A table; split between rows where a page ends (its header repeated)."""
        for start in range(0, max(len(rows), 1), 30):
            part = rows[start : start + 30]
            self.blocks.append(Block(ROW * (len(part) + 1) + 0.15, self.table_drawer(header, part)))

    def image(self, png: bytes, aspect: float) -> None:
        """A PNG `aspect` (height / width) times as high as wide, at the page's width."""
        height = self.width * aspect
        self.blocks.append(Block(height + 0.1, lambda fig, top: self.picture(fig, top, png, height)))

    # --- drawing ------------------------------------------------------------------------------------------------
    def text(self, figure: Any, top: float, text: str, size: float, weight: str = "normal") -> None:
        page_width, page_height = self.size
        figure.text(MARGIN / page_width, 1 - top / page_height, text, va="top", ha="left", fontsize=size,
                    fontweight=weight, family="sans-serif", linespacing=1.35)  # fmt: skip

    def table_drawer(self, header: list[str], rows: list[list[str]]) -> Draw:
        def draw(figure: Any, top: float) -> None:
            page_width, page_height = self.size
            height = ROW * (len(rows) + 1)
            axes = figure.add_axes((MARGIN / page_width, 1 - (top + height) / page_height, self.width / page_width,
                                    height / page_height))  # fmt: skip
            axes.axis("off")
            table = axes.table(cellText=rows or [["" for _ in header]], colLabels=header, loc="upper left",
                               cellLoc="right", colLoc="right", bbox=(0, 0, 1, 1))  # fmt: skip
            table.auto_set_font_size(False)
            table.set_fontsize(9)
            for (row, column), cell in table.get_celld().items():
                cell.set_edgecolor("#dddddd")
                if column == 0:
                    cell.set_text_props(ha="left")
                if row == 0:
                    cell.set_text_props(fontweight="bold")
                elif row % 2 == 0:
                    cell.set_facecolor("#f4f4f4")

        return draw

    def picture(self, figure: Any, top: float, png: bytes, height: float) -> None:
        import matplotlib.image as mpimg

        page_width, page_height = self.size
        axes = figure.add_axes((MARGIN / page_width, 1 - (top + height) / page_height, self.width / page_width,
                                height / page_height))  # fmt: skip
        axes.imshow(mpimg.imread(io.BytesIO(png), format="png"))
        axes.axis("off")

    # --- pages --------------------------------------------------------------------------------------------------
    def pages(self) -> list[list[tuple[Block, float]]]:
        """The blocks placed on pages: each page's (block, top)."""
        usable = self.size[1] - 2 * MARGIN - 0.3  # the page number's line below
        pages: list[list[tuple[Block, float]]] = [[]]
        used = 0.0
        for index, block in enumerate(self.blocks):
            following = self.blocks[index + 1].height if block.keep_with_next and index + 1 < len(self.blocks) else 0
            if pages[-1] and used + block.height + following > usable:
                pages.append([])
                used = 0.0
            pages[-1].append((block, MARGIN + used))
            used += block.height
        return pages

    def save(self, path: Path) -> int:
        """Writes the PDF; how many pages it has."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.backends.backend_pdf import PdfPages

        pages = self.pages()
        with PdfPages(path) as document:
            for number, placed in enumerate(pages, 1):
                figure = plt.figure(figsize=self.size)
                for block, top in placed:
                    block.draw(figure, top)
                figure.text(0.5, (MARGIN / 2) / self.size[1], f"page {number} of {len(pages)}", ha="center",
                            fontsize=8, color="#555555")  # fmt: skip
                document.savefig(figure)
                plt.close(figure)
        return len(pages)
