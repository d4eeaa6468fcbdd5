"""The runtime registry: one entry per runtime, one shared build engine.

An entry says which base image a runtime starts from, which pinned installer
shapes its dependency payload, how its dependency manifests turn into an install
step, and what its function layer adds (environment, an injected file, a build
step). ``relay.adapters.docker.dockerfiles`` renders entries into Dockerfiles;
``relay.adapters.docker.images`` builds them. A new runtime (``python3.15``,
``node26``) is one more entry in :data:`RUNTIMES`.

Everything here is pure: planners read the selected source as a mapping from
path to bytes and raise :class:`~relay.domain.errors.BuildError` for a project
that cannot be built, before any image build starts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from relay.adapters.docker import pins
from relay.domain.errors import BuildError

APP_DIR = "/app"
DEPS_STAGING_DIR = "/tmp/relay-deps"  # noqa: S108 - build-time staging inside the image


@dataclass(frozen=True)
class DependencyPlan:
    """How a function's dependencies install: the manifest files copied into the
    dependency image's context and the shell script that installs them (None
    when there is nothing to install)."""

    kind: str
    manifests: tuple[tuple[str, bytes], ...] = ()
    workdir: str = APP_DIR
    install: str | None = None


@dataclass(frozen=True)
class FunctionPlan:
    """What the function layer adds on top of the selected source: files Relay
    injects (``package.json`` for Node) and one build script run in the image
    (the TypeScript bundle), removed tooling included."""

    injected: tuple[tuple[str, bytes], ...] = ()
    build: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Runtime:
    """One registry entry."""

    name: str
    base_image: str
    installer: str
    """The pinned external install tool; part of the dependency fingerprint."""
    dependency_preamble: tuple[str, ...]
    """Dockerfile lines every dependency image of this runtime starts with."""
    env: Mapping[str, str]
    plan_dependencies: Callable[[Mapping[str, bytes]], DependencyPlan]
    plan_function: Callable[[Mapping[str, bytes], tuple[str, ...]], FunctionPlan] = field(
        default=lambda files, modules: FunctionPlan()
    )


# --- python3.14 --------------------------------------------------------------------
def plan_python_dependencies(files: Mapping[str, bytes]) -> DependencyPlan:
    """``uv.lock`` + ``pyproject.toml`` (locked install), else ``requirements.txt``;
    an incomplete native project is an error, never a guess."""
    has_lock, has_project = "uv.lock" in files, "pyproject.toml" in files
    has_requirements = "requirements.txt" in files
    if has_lock and not has_project:
        raise BuildError("uv.lock without pyproject.toml: commit both, or remove uv.lock")
    manifests: tuple[tuple[str, bytes], ...]
    if has_lock:
        manifests = (("pyproject.toml", files["pyproject.toml"]), ("uv.lock", files["uv.lock"]))
        install = (
            f"cd {DEPS_STAGING_DIR}"
            " && UV_PYTHON_DOWNLOADS=never uv export --locked --no-dev --no-emit-project"
            " --no-cache --quiet --output-file requirements.lock.txt"
            " && uv pip install --system --no-cache -r requirements.lock.txt"
            f" && cd / && rm -rf {DEPS_STAGING_DIR}"
        )
        return DependencyPlan("uv-lock", manifests, DEPS_STAGING_DIR, install)
    if has_requirements:
        manifests = (("requirements.txt", files["requirements.txt"]),)
        install = (
            f"uv pip install --system --no-cache -r {DEPS_STAGING_DIR}/requirements.txt"
            f" && rm -rf {DEPS_STAGING_DIR}"
        )
        return DependencyPlan("requirements", manifests, DEPS_STAGING_DIR, install)
    if has_project:
        raise BuildError(
            "pyproject.toml without uv.lock: run `uv lock` and commit uv.lock,"
            " or list dependencies in requirements.txt"
        )
    return DependencyPlan("none")


PY_SUFFIXES = (".py", "/__init__.py")


def resolve_python_module(module: str, files: Collection[str]) -> str:
    """The source file a Python handler module is imported from: ``a/b.py`` or the
    package ``a/b/__init__.py`` (the bootstrap imports it from the application
    directory). Raises ``BuildError`` when neither is among the function's files:
    the image would build, and every invocation would then fail on the import."""
    base = module.replace(".", "/")
    for suffix in PY_SUFFIXES:
        if base + suffix in files:
            return base + suffix
    looked = ", ".join(base + suffix for suffix in PY_SUFFIXES)
    raise BuildError(f"handler module {module!r} not found (looked for {looked})")


def plan_python_function(files: Mapping[str, bytes], modules: tuple[str, ...]) -> FunctionPlan:
    """Nothing to add for Python; every handler module must be a source file."""
    for module in modules:
        resolve_python_module(module, files)
    return FunctionPlan()


# --- node24 ------------------------------------------------------------------------
JS_SUFFIXES = (".mjs", ".js", "/index.mjs", "/index.js")
TS_SUFFIXES = (".mts", ".ts", "/index.mts", "/index.ts")
INJECTED_PACKAGE_JSON = b'{"type":"module"}\n'


def plan_node_dependencies(files: Mapping[str, bytes]) -> DependencyPlan:
    """``package-lock.json`` -> ``npm ci``; else ``package.json`` -> ``npm install``."""
    has_manifest, has_lock = "package.json" in files, "package-lock.json" in files
    npm = "--omit=dev --no-audit --no-fund --loglevel=error"
    if has_lock and not has_manifest:
        raise BuildError("package-lock.json without package.json: commit both")
    manifests: tuple[tuple[str, bytes], ...]
    if has_lock:
        manifests = (
            ("package.json", files["package.json"]),
            ("package-lock.json", files["package-lock.json"]),
        )
        return DependencyPlan("npm-ci", manifests, APP_DIR, f"npm ci {npm} && {_NPM_CLEAN}")
    if has_manifest:
        manifests = (("package.json", files["package.json"]),)
        return DependencyPlan(
            "npm-install", manifests, APP_DIR, f"npm install {npm} && {_NPM_CLEAN}"
        )
    return DependencyPlan("none")


_NPM_CLEAN = "rm -rf /root/.npm /tmp/*"


def resolve_node_module(module: str, files: Collection[str]) -> str:
    """The one source file a Node handler module resolves to, in the bootstrap's
    order: JavaScript candidates first, TypeScript only when none exists.

    Raises ``BuildError`` when the module has both a JavaScript and a TypeScript
    candidate (which one runs would depend on a generated file) or neither.
    """
    base = module.replace(".", "/")
    js = [base + suffix for suffix in JS_SUFFIXES if base + suffix in files]
    ts = [base + suffix for suffix in TS_SUFFIXES if base + suffix in files]
    if js and ts:
        raise BuildError(
            f"handler module {module!r} is ambiguous: both {js[0]} and {ts[0]} exist;"
            " keep only one of them"
        )
    if not js and not ts:
        looked = ", ".join(base + suffix for suffix in (*JS_SUFFIXES, *TS_SUFFIXES))
        raise BuildError(f"handler module {module!r} not found (looked for {looked})")
    return (js or ts)[0]


def bundled_output(source: str) -> str:
    """Where the bundle of a TypeScript module goes: beside it, as ``.mjs``."""
    stem = source.rsplit(".", 1)[0]
    return f"{stem}.mjs"


# The bundle is ESM; a bundled CommonJS dependency may call require(), which an
# ESM bundle only has when the banner defines it.
_REQUIRE_BANNER = (
    "import { createRequire as __relayCreateRequire } from 'node:module';"
    " const require = __relayCreateRequire(import.meta.url);"
)


def plan_node_function(files: Mapping[str, bytes], modules: tuple[str, ...]) -> FunctionPlan:
    """Inject ``{"type":"module"}`` when there is no ``package.json``; resolve every
    handler module and bundle the TypeScript ones with the pinned esbuild, in an
    ephemeral install removed in the same layer."""
    injected: tuple[tuple[str, bytes], ...] = ()
    if "package.json" not in files:
        injected = (("package.json", INJECTED_PACKAGE_JSON),)
    entries = sorted({resolve_node_module(m, files) for m in modules})
    typescript = [e for e in entries if e.endswith(TS_SUFFIXES)]
    if not typescript:
        return FunctionPlan(injected=injected)
    tool = "/tmp/relay-esbuild"  # noqa: S108 - removed in the same layer
    args = [
        *typescript,
        "--bundle",
        "--platform=node",
        "--format=esm",
        "--target=node24",
        "--packages=external",
        "--outbase=.",
        "--outdir=.",
        "--out-extension:.js=.mjs",
        "--log-level=warning",
        f"--banner:js={_REQUIRE_BANNER}",
    ]
    if "tsconfig.json" in files:
        args.append("--tsconfig=tsconfig.json")
    script = " && ".join(
        [
            "set -e",
            f"npm install --prefix {tool} --no-save --no-audit --no-fund --loglevel=error"
            f" esbuild@{pins.ESBUILD_VERSION} >/dev/null",
            " ".join([f"{tool}/node_modules/.bin/esbuild", *(_sh_quote(a) for a in args)]),
            f"rm -rf {tool} /root/.npm /tmp/node-compile-cache",
        ]
    )
    outputs = tuple(f"{source} -> {bundled_output(source)}" for source in typescript)
    return FunctionPlan(injected=injected, build=script, notes=outputs)


def _sh_quote(text: str) -> str:
    if text and all(c.isalnum() or c in "-_./=:@" for c in text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


RUNTIMES: Mapping[str, Runtime] = {
    "python3.14": Runtime(
        name="python3.14",
        base_image=pins.PYTHON_BASE_IMAGE,
        installer=pins.UV_IMAGE,
        dependency_preamble=(f"COPY --from={pins.UV_IMAGE} /uv /uvx /bin/",),
        env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"},
        plan_dependencies=plan_python_dependencies,
        plan_function=plan_python_function,
    ),
    "node24": Runtime(
        name="node24",
        base_image=pins.NODE_BASE_IMAGE,
        installer=f"npm from {pins.NODE_BASE_IMAGE}; esbuild@{pins.ESBUILD_VERSION}",
        dependency_preamble=(),
        env={},
        plan_dependencies=plan_node_dependencies,
        plan_function=plan_node_function,
    ),
}
