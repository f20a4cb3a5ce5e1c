"""The step kinds. Each module exposes ``KIND``, ``VERSION`` and ``run(ctx) -> None``.

Bump a kind's ``VERSION`` whenever the code that produces its output changes: the version is
part of every digest of that kind, so old outputs are not reused for new code.
"""
