"""``push`` and ``cache keygen``: publishing builds to a binary cache, signed."""

from __future__ import annotations

import os
from pathlib import Path

from qwen38build.cli import stages
from qwen38build.errors import ExitCode, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from qwen38build.store.store import Store



def cmd_push(args: argparse.Namespace) -> int:
    from qwen38build.cache import config as cacheconfig
    from qwen38build.cache.push import closure_digests, push
    from qwen38build.cache.signing import SecretKey
    from qwen38build.engine.report import make_reporter

    cfg = cacheconfig.load(offline=args.offline)
    if cfg.offline:
        raise UsageError("push needs the network, and --offline (or $QWEN38BUILD_OFFLINE) "
                         "forbids it.")
    url = cacheconfig.check_url(args.url, "push URL")
    key_file = Path(args.key) if args.key else cfg.secret_key_file
    if key_file is None:
        raise UsageError("push needs a signing key: an unsigned entry is never used.",
                         hint="give --key FILE (from `qwen38build cache keygen NAME`), or set "
                         "QWEN38BUILD_SECRET_KEY_FILE or cache.secret-key-file")
    key = SecretKey.load(key_file)
    store = stages.open_store(args)
    builds = args.build or _default_builds(args, store)
    result = push(store, url, closure_digests(store, builds), key, timeout=cfg.timeout,
                  reporter=make_reporter(quiet=args.quiet))
    stages.emit(args, {"url": url, "sent": result.sent, "present": result.present,
                "bytes": result.bytes_sent},
         f"pushed {len(result.sent)} entries ({result.bytes_sent / 1e6:.1f} MB) to {url}; "
         f"{len(result.present)} were there already")
    return ExitCode.OK


def _default_builds(args: argparse.Namespace, store: Store) -> list[str]:
    """./result's build, and the last kernels build of this recipe, when recorded."""
    from qwen38build.store.record import roots

    found = []
    link = Path(args.recipe).parent / "result"
    if link.is_symlink():
        found.append(Path(os.readlink(link)).name)
    recorded = roots(store)
    if Path(args.recipe).is_file():
        name = stages.root_name(stages.load_recipe(args))
        for root in (name, name + "-kernels"):
            if root in recorded and recorded[root] not in found:
                found.append(recorded[root])
    if not found:
        raise UsageError("no build to push.", hint="name a build hash, or build first")
    return found


def cmd_cache_keygen(args: argparse.Namespace) -> int:
    from qwen38build.cache.signing import SecretKey, write_key_pair

    key = SecretKey.generate(args.name)
    if args.dir is not None:
        out = Path(args.dir)
    else:  # the user's config dir, private; never the working directory (often a project)
        from platformdirs import user_config_dir

        out = Path(user_config_dir("qwen38build"))
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret, public = out / f"{args.name}.sec", out / f"{args.name}.pub"
    write_key_pair(key, secret, public)
    print(f"secret key {secret} (keep it private; push --key {secret})\n"
          f"public key {public}: {key.public()}")
    return ExitCode.OK
