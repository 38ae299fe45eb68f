"""Image files as a model's input: read by Pillow, resized to the input (stretched, or to its height keeping the
aspect ratio and zero-padded on the right, as PaddleOCR's text-line models), scaled, normalized per channel and
laid out as the input (NCHW or NHWC, from where its 3 channels are); with the factors that map the image's pixels
to the input's (box labels are given in the image's pixels)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.data import InputInfo
from harness.errors import EvaluationError
from harness.evaluation.spec import ImageSection

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class ImageInput:
    """One image as the model's input, and the factors (x, y) from the image's pixels to the input's."""

    array: np.ndarray
    scale_xy: tuple[float, float]


def is_image(path: Path) -> bool:
    """True when the file's suffix is an image format the loader reads."""
    return path.suffix.lower() in IMAGE_SUFFIXES


def _layout(info: InputInfo) -> tuple[int, int, bool]:
    """Return (height, width, channels_first) of an image input: (1, 3, H, W) or (1, H, W, 3)."""
    shape = info.shape
    if len(shape) == 4 and shape[0] == 1 and shape[1] == 3:
        return shape[2], shape[3], True
    if len(shape) == 4 and shape[0] == 1 and shape[3] == 3:
        return shape[1], shape[2], False
    raise EvaluationError(f"input '{info.name}' has shape {list(shape)}: an image sample needs an input of shape "
                          "(1, 3, H, W) or (1, H, W, 3)")


def load_image(path: Path, info: InputInfo, image: ImageSection) -> ImageInput:
    """Return the image file as the input `info` takes it, preprocessed as `image` says; raises EvaluationError
    naming the file when Pillow cannot read it or the input is not an image's."""
    from PIL import Image, UnidentifiedImageError

    h, w, channels_first = _layout(info)
    try:
        with Image.open(path) as opened:
            picture = opened.convert("RGB")
    except (OSError, UnidentifiedImageError) as e:
        raise EvaluationError(f"evaluation sample {path}: cannot read as an image: {e}") from None
    width, height = picture.size
    if image.resize == "stretch":
        resized_w = w
    else:
        resized_w = max(1, min(w, int(np.ceil(h * width / height))))
    pixels = np.asarray(picture.resize((resized_w, h), Image.BILINEAR), dtype=np.float32)
    if image.channels == "bgr":
        pixels = pixels[..., ::-1]
    mean, std = np.asarray(image.mean, np.float32), np.asarray(image.std, np.float32)
    out = np.zeros((h, w, 3), dtype=np.float32)  # keep_ratio_pad: zero after normalization, as PaddleOCR pads
    out[:, :resized_w] = (pixels * np.float32(image.scale) - mean) / std
    tensor = out.transpose(2, 0, 1)[None] if channels_first else out[None]
    return ImageInput(tensor.astype(info.dtype), (resized_w / width, h / height))
