"""A stand-in Hugging Face Hub on 127.0.0.1: just the endpoints huggingface_hub's `create_repo` and
`upload_folder` call (repo creation, the pre-upload check, the LFS batch API with basic transfer, the
commit), keeping what was pushed in memory. Point HF_ENDPOINT at `url`. Anything else answers 404 and
is recorded in `unknown`, so a test sees a client that asks for more than this server knows."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)


class HubServer:
    def __init__(self, token: str = "hf_standin_token") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.unknown: list[str] = []
        self.requests: list[str] = []
        self.authorized: list[bool] = []
        self.metadata: list[dict[str, Any]] = []
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: Any) -> None:  # quiet
        return

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(self, status: int, payload: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        ok = self.headers.get("Authorization") == f"Bearer {self.hub.token}"
        self.hub.authorized.append(ok)
        return ok

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self._body()
        path = self.path.split("?", 1)[0]
        self.hub.requests.append(f"POST {path}")
        if not self._authorized():
            return self._answer(401, {"error": "Invalid credentials in Authorization header"})
        parts = path.strip("/").split("/")
        if path == "/api/repos/create":
            spec = json.loads(body)
            repo_id = f"{spec['organization']}/{spec['name']}" if spec.get("organization") else spec["name"]
            if repo_id in self.hub.repos:
                return self._answer(
                    409, {"error": "You already created this model repo", "url": self._repo_url(repo_id)}
                )
            private = spec.get("visibility", "private" if spec.get("private") else "public") != "public"
            self.hub.repos[repo_id] = Repo(private=private)
            return self._answer(200, {"url": self._repo_url(repo_id), "name": repo_id})
        if path == "/api/validate-yaml":  # the README's metadata, checked as the Hub does before a commit
            return self._validate_yaml(json.loads(body)["content"])
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "preupload":
            files = json.loads(body)["files"]
            modes = [
                {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular",
                 "shouldIgnore": False}
                for f in files
            ]  # fmt: skip
            return self._answer(200, {"files": modes, "commitOid": "0" * 40})
        if path.endswith(".git/info/lfs/objects/batch"):
            request = json.loads(body)
            objects = [
                {
                    "oid": o["oid"],
                    "size": o["size"],
                    "authenticated": True,
                    "actions": {"upload": {"href": f"{self.hub.url}/lfs-upload/{o['oid']}"}},
                }
                for o in request["objects"]
                if o["oid"] not in self.hub.lfs
            ]
            return self._answer(
                200,
                {"transfer": "basic", "objects": objects},
                {"Content-Type": "application/vnd.git-lfs+json"},
            )
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "commit":
            return self._commit(f"{parts[2]}/{parts[3]}", body)
        self.hub.unknown.append(f"POST {path}")
        return self._answer(404, {"error": f"stand-in Hub: no POST {path}"})

    def do_PUT(self) -> None:  # noqa: N802
        body = self._body()
        path = self.path.split("?", 1)[0]
        self.hub.requests.append(f"PUT {path}")
        if path.startswith("/lfs-upload/"):
            oid = path.rsplit("/", 1)[1]
            if hashlib.sha256(body).hexdigest() != oid:
                return self._answer(400, {"error": "sha256 mismatch"})
            self.hub.lfs[oid] = body
            return self._answer(200)
        self.hub.unknown.append(f"PUT {path}")
        return self._answer(404, {"error": f"stand-in Hub: no PUT {path}"})

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        self.hub.requests.append(f"GET {path}")
        self.hub.unknown.append(f"GET {path}")
        return self._answer(404, {"error": f"stand-in Hub: no GET {path}"})

    def _validate_yaml(self, content: str) -> None:
        """The README's front matter: valid YAML, a mapping, a base_model that is a model id."""
        import re

        import yaml

        def refuse(message: str) -> None:
            return self._answer(400, {"errors": [{"message": message}]})

        found = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        if not found:
            return self._answer(
                200, {"warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
            )
        try:
            meta = yaml.safe_load(found.group(1))
        except yaml.YAMLError as exc:
            return refuse(f"YAML: {exc}")
        if not isinstance(meta, dict):
            return refuse("metadata must be a mapping")
        self.hub.metadata.append(meta)
        bases = meta.get("base_model")
        for base in [bases] if isinstance(bases, str) else bases or []:
            if not re.match(r"^[\w.-]+(/[\w.-]+)?$", str(base)):
                return refuse(f'"base_model" with value "{base}" is not a valid model id')
        return self._answer(200, {"warnings": []})

    def _repo_url(self, repo_id: str) -> str:
        return f"{self.hub.url}/{repo_id}"

    def _commit(self, repo_id: str, body: bytes) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._answer(404, {"error": f"Repository not found: {repo_id}"})
        for line in body.decode().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "file":
                repo.files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "lfsFile":
                if value["oid"] not in self.hub.lfs:
                    return self._answer(400, {"error": f"LFS object {value['oid']} was never uploaded"})
                repo.files[value["path"]] = self.hub.lfs[value["oid"]]
            elif item["key"] == "deletedFile":
                repo.files.pop(value["path"], None)
        oid = hashlib.sha1(body).hexdigest()
        repo.commits.append(oid)
        return self._answer(
            200,
            {
                "commitUrl": f"{self._repo_url(repo_id)}/commit/{oid}",
                "commitOid": oid,
                "pullRequestUrl": None,
            },
        )
