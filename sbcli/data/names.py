"""Class and folder names that are not valid UTF-8 (a Linux file name is any bytes but ``/`` and NUL).

Python lists such a name with ``surrogateescape``: each byte that is not part of valid UTF-8 becomes
the lone surrogate U+DC80..U+DCFF (``b"caf\\xe9"`` -> ``"caf\\udce9"``). sbcli keeps that string as the
class name everywhere, so it opens the same folder and round-trips losslessly:

* in ``learner.json`` and ONNX metadata (JSON, ASCII-escaped) it is written ``"caf\\udce9"``, which
  JSON readers give back as the same string (``os.fsencode`` turns it into the folder's bytes);
* a data fingerprint hashes the name's bytes on disk (:func:`name_bytes`), so valid UTF-8 names
  hash as before;
* text meant to be read (the model card) shows such a byte as ``\\xe9`` (:func:`shown`); Triton's
  ``labels.txt`` holds the name's bytes.
"""

from __future__ import annotations


def name_bytes(text: str) -> bytes:
    """The bytes ``text`` came from: UTF-8, with surrogate-escaped bytes restored (others escaped as ``\\udXXX``)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no file name produced (a hand-written learner.json)
        return text.encode("utf-8", "backslashreplace")


def shown(text: str) -> str:
    """``text`` as a person reads it: valid UTF-8 unchanged, any other byte as ``\\xNN``."""
    return name_bytes(text).decode("utf-8", "backslashreplace")
