"""The Nomad job specs, rendered from checked values with the Jinja2 templates beside this module.

Every value reaches the HCL through the ``hcl`` filter, which writes it as an HCL literal (a
quoted string with HCL's escapes, a number, ``true``/``false``, a list); the environment's
``finalize`` refuses any other output, so no value can break out of its string. A reference in
``${…}`` is kept: it is Nomad's runtime interpolation, which values may use
(``${node.unique.name}``, ``${meta.rack}``, ``${NOMAD_ALLOC_INDEX}``); any other ``${`` is
written ``$${`` and every ``%{`` ``%%{``, so that Nomad's parser reads them as text and never
evaluates an expression or a template directive a value carried in.
The consul-template text of the ``template`` blocks is written raw (``{% raw %}``): it shares
``{{ }}`` with Jinja2.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

import jinja2

from gpuledger import __version__
from gpuledger.commands.render.values_file import fleet_discovery

NODE_FILE = "gpuledger.nomad.hcl"
IDENTITY_FILE = "gpuledger.wi.nomad.hcl"
FLEET_FILE = "gpuledger-fleet.nomad.hcl"
RELEASE_FILE = "gpuledger.pex"
TOKEN_FILE = "${NOMAD_SECRETS_DIR}/nomad_token"  # noqa: S105 - a path, not a secret
TASK_API = "unix://${NOMAD_SECRETS_DIR}/api.sock"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INTERPOLATION = re.compile(
    r"(?P<literal>\$\$\{)|\$\{(?P<reference>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*\})?"
)
"""``$${`` (already HCL's literal ``${``), or ``${`` and, when one follows, a runtime reference
such as ``node.unique.name}`` or ``attr.unique.network.ip-address}``."""
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class Hcl(str):
    """Text that is already HCL: the only thing a template may output."""

    __slots__ = ()


def _hcl_string(text: str) -> str:
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    # %{ would open an HCL template directive, ${ an expression: only a reference stays
    escaped = _INTERPOLATION.sub(_escaped, "".join(out)).replace("%{", "%%{")
    return '"' + escaped + '"'


def _escaped(found: re.Match[str]) -> str:
    """``$${`` (HCL's literal ``${``) unless a runtime reference follows, or it is one already."""
    return found[0] if found["reference"] or found["literal"] else "$${"


def hcl(value: Any) -> Hcl:
    """``value`` as an HCL literal."""
    if isinstance(value, bool):
        return Hcl("true" if value else "false")
    if isinstance(value, int):
        return Hcl(str(value))
    if isinstance(value, str):
        return Hcl(_hcl_string(value))
    if isinstance(value, list | tuple):
        return Hcl("[" + ", ".join(hcl(item) for item in value) + "]")
    raise TypeError(f"no HCL literal for {type(value).__name__}")


def hcl_lines(items: list[Any], indent: int) -> Hcl:
    """A list as HCL, one item a line, its closing bracket at ``indent``."""
    inner = "".join(f"{' ' * (indent + 2)}{hcl(item)},\n" for item in items)
    return Hcl(f"[\n{inner}{' ' * indent}]")


def ident(name: str, width: int = 0) -> Hcl:
    """An attribute name (an environment variable's), which must be an identifier, padded to
    ``width`` so that the ``=`` of a block line up."""
    if not _IDENT.match(name):
        raise ValueError(f"{name!r} is not an HCL identifier")
    return Hcl(name.ljust(width))


def comment(text: str) -> Hcl:
    """Text for the rest of a ``#`` comment line."""
    if "\n" in text or "\r" in text:
        raise ValueError(f"{text!r} would end the comment")
    return Hcl(text)


def go_string(text: str) -> Hcl:
    """A Go string literal for consul-template (a Nomad Variable path)."""
    if "${" in text or "%{" in text:
        raise ValueError(f"{text!r} would be interpolated by HCL")
    return Hcl(json.dumps(text))


def _only_hcl(value: Any) -> Any:
    if not isinstance(value, Hcl):
        raise TypeError(f"template output {value!r} did not go through the hcl filter")
    return value


@functools.cache
def environment() -> jinja2.Environment:
    """The templates, strict about undefined names and about what they output; made once, so
    that each template is compiled once."""
    env = jinja2.Environment(  # noqa: S701 - HCL, not HTML: every value goes through |hcl
        loader=jinja2.PackageLoader("gpuledger.commands.render", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_only_hcl,
    )
    env.filters.update(
        hcl=hcl, hcl_lines=hcl_lines, ident=ident, comment=comment, go_string=go_string
    )
    return env


def _nomad_args(values: Mapping[str, Any], *, identity: bool) -> list[str]:
    """How the task reaches its Nomad agent: the Task API and its identity, or a token file
    written from the job's variable, and TLS."""
    nomad = values["nomad"]
    # NVIDIA's plugin is gpuledger's default: the flag only where the values name another.
    kinds = [] if nomad["gpuDevices"] == ["nvidia/gpu"] else [",".join(nomad["gpuDevices"])]
    kinds = ["--nomad-gpu-devices", *kinds] if kinds else []
    if identity:
        return ["--nomad-addr", TASK_API, "--nomad-token-file", TOKEN_FILE, *kinds]
    tls = nomad["tls"]
    args = ["--nomad-token-file", TOKEN_FILE, *kinds]
    # the node's own agent: a container reaches it at the node's address, not its own loopback
    docker = values["driver"] == "docker"
    host = "${attr.unique.network.ip-address}" if docker else "127.0.0.1"
    scheme = "https" if tls["enabled"] else "http"
    addr = nomad["addr"] or (f"{scheme}://{host}:4646" if docker or tls["enabled"] else "")
    if addr:
        args += ["--nomad-addr", addr]
    if tls["enabled"]:
        args += ["--nomad-ca-cert", tls["caCert"], "--nomad-client-cert", tls["clientCert"]]
        args += ["--nomad-client-key", tls["clientKey"]]
        if tls["serverName"]:
            args += ["--nomad-tls-server-name", tls["serverName"]]
    return args


def _listen(values: Mapping[str, Any]) -> str:
    # raw_exec binds the address Nomad gave the port; a container binds every address of its own
    return ":${NOMAD_PORT_http}" if values["driver"] == "docker" else "${NOMAD_ADDR_http}"


def node_args(values: Mapping[str, Any], *, identity: bool) -> list[str]:
    """The arguments of ``gpuledger serve`` in the node job."""
    node = values["node"]
    args = ["serve", "--listen", _listen(values), "--interval", node["interval"]]
    args += ["--nomad-node-id", "${node.unique.id}"]
    if node["history"]:
        args += ["--history", "${NOMAD_ALLOC_DIR}/data/history.json"]
    if values["policy"]["fromVariable"]:
        args += ["--policy", "${NOMAD_TASK_DIR}/policy.yaml"]
    if node["nodeMeta"]["publish"]:
        args += ["--publish-node-meta"]
        if node["nodeMeta"]["clearOnExit"]:
            args += ["--clear-node-meta-on-exit"]
    return [*args, *_nomad_args(values, identity=identity), *node["extraArgs"]]


def fleet_args(values: Mapping[str, Any]) -> list[str]:
    """The arguments of ``gpuledger fleet serve`` in the fleet job."""
    fleet = values["fleet"]
    args = ["fleet", "serve", "--listen", _listen(values), "--interval", fleet["interval"]]
    args += ["--shard", f"${{NOMAD_ALLOC_INDEX}}/{fleet['shards']}"]
    way = fleet_discovery(values)
    if way == "nomad":
        args += ["--nomad-service", values["node"]["job"]]
        args += ["--nomad-namespace", values["namespace"]]
    elif way == "consul":
        args += ["--consul", "--consul-service", values["node"]["job"]]
    else:
        args += ["--targets", ",".join(fleet["targets"])]
    if values["policy"]["fromVariable"]:
        args += ["--policy", "${NOMAD_TASK_DIR}/policy.yaml"]
    return [*args, *_nomad_args(values, identity=False), *fleet["extraArgs"]]


def _mounts(values: Mapping[str, Any], *, node: bool, identity: bool) -> list[str]:
    """Host paths the container binds read-only: the runtime sockets, the TLS files."""
    paths = list(values["docker"]["mounts"]) if node else []
    tls = values["nomad"]["tls"]
    if tls["enabled"] and not identity:
        paths += [tls["caCert"], tls["clientCert"], tls["clientKey"]]
    return list(dict.fromkeys(paths))


def _context(values: Mapping[str, Any], job: str, *, identity: bool) -> dict[str, Any]:
    section = values[job]
    node = job == "node"
    env = {"PEX_ROOT": "${NOMAD_TASK_DIR}/.pex"}
    if node and values["driver"] == "docker":
        env |= {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    return {
        "v": values,
        "kind": job,
        "job": section,
        "identity": identity,
        "args": node_args(values, identity=identity) if node else fleet_args(values),
        "env": env | dict(section["extraEnv"]),
        "mounts": _mounts(values, node=node, identity=identity),
        "variable_path": f"nomad/jobs/{section['job']}",
        "release_file": RELEASE_FILE,
        "version": __version__,
    }


def render_jobs(values: Mapping[str, Any]) -> dict[str, str]:
    """Every job file the values ask for, by file name, in a stable order."""
    env = environment()
    node = env.get_template("job.nomad.hcl.j2")
    files = {NODE_FILE: node.render(_context(values, "node", identity=False))}
    if values["workloadIdentity"]["enabled"]:
        files[IDENTITY_FILE] = node.render(_context(values, "node", identity=True))
    if values["fleet"]["enabled"]:
        fleet = env.get_template("job.nomad.hcl.j2")
        files[FLEET_FILE] = fleet.render(_context(values, "fleet", identity=False))
    return files
