"""API errors in each family's shape: OpenAI ``{"error": {message, type, param, code}}`` and Google
``{"error": {code, message, status, details}}`` for the Vertex routes. Spec and dataset problems
come back as 400 naming every field path."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from openrft.data.loader import DatasetError
from openrft.disk_full import DISK_FULL_MESSAGE, is_disk_full
from openrft.errors import OpenRFTError
from openrft.service.schemas import CODED_ERRORS
from openrft.service.store import Conflict, NotFound
from openrft.service.store.base import QuotaExceeded
from openrft.spec.document_limits import MAX_DEPTH, DocumentLimitError, check_document
from openrft.spec.errors import SpecError, join_path

log = logging.getLogger("openrft.service")

GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "FAILED_PRECONDITION",
    413: "OUT_OF_RANGE",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    507: "RESOURCE_EXHAUSTED",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        problems: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.problems = problems or []
        self.headers = headers or {}


def check_request_document(document: Any, what: str) -> None:
    """A 400 naming the bound when a request's document nests too deeply or expands past the size bound."""
    try:
        check_document(document, what)
    except DocumentLimitError as exc:
        raise ApiError(400, str(exc), "document_too_complex") from None


def is_google_path(path: str) -> bool:
    return path.startswith(("/v1/projects/", "/v1beta1/projects/"))


def error_response(path: str, error: ApiError) -> JSONResponse:
    if path.startswith("/api/v1/"):  # the Tinker API's shape (service/tinker)
        body = {"detail": error.message, **({"code": error.code} if error.code else {})}  # insufficient_quota
        return JSONResponse(body, status_code=error.status, headers=error.headers)
    if is_google_path(path):
        details = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": p["param"], "description": p["message"]} for p in error.problems],
            }
        ]
        body = {
            "error": {
                "code": error.status,
                "message": error.message,
                "status": GOOGLE_STATUS.get(error.status, "UNKNOWN"),
                "details": details if error.problems else [],
            }
        }
    else:
        kind = {401: "authentication_error", 429: "rate_limit_error", 500: "server_error", 507: "server_error"}.get(
            error.status, "invalid_request_error"
        )
        body = {"error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}}
        if error.problems:
            body["error"]["problems"] = error.problems
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
    return JSONResponse(body, status_code=error.status, headers={**headers, **error.headers})


def from_spec_error(exc: SpecError, code: str = "invalid_job") -> ApiError:
    problems = [{"param": p.path, "message": str(p)} for p in exc.problems]
    return ApiError(400, str(exc), code, problems[0]["param"] if problems else None, problems)


def from_dataset_error(exc: DatasetError, field: str, shown_as: str | None = None) -> ApiError:
    """Dataset problems name the file (by its id, not the server path), line and field."""
    text = str(exc)
    if shown_as:
        text = text.replace(exc.location, shown_as)
    problems = [
        {"param": field, "message": str(p).replace(exc.location, shown_as or exc.location)} for p in exc.problems
    ]
    return ApiError(
        400,
        f"{field}: {text}",
        "invalid_training_file" if "validation" not in field else "invalid_validation_file",
        field,
        problems,
    )


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(request.url.path, exc)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound):
        return error_response(request.url.path, ApiError(404, f"no such object: {exc.args[0]}", "not_found"))

    @app.exception_handler(Conflict)
    async def _conflict(request: Request, exc: Conflict):
        return error_response(request.url.path, ApiError(409, str(exc), exc.code))

    @app.exception_handler(QuotaExceeded)
    async def _quota(request: Request, exc: QuotaExceeded):
        headers = {"Retry-After": "60"} if exc.status == 429 else None
        return error_response(request.url.path, ApiError(exc.status, str(exc), exc.code, headers=headers))

    @app.exception_handler(SpecError)
    async def _spec_error(request: Request, exc: SpecError):
        return error_response(request.url.path, from_spec_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        for item in exc.errors():
            if item.get("type") in CODED_ERRORS:  # a request's own check (schemas.py): its code, message, param
                context = item.get("ctx") or {}
                error = ApiError(400, context["message"], item["type"], context.get("param"))
                return error_response(request.url.path, error)
        problems = []
        for item in exc.errors():
            loc = [p for p in item.get("loc", ()) if p not in ("body", "query", "path", "header")]
            problems.append({"param": join_path(loc), "message": f"{join_path(loc)}: {item.get('msg')}"})
        message = "; ".join(p["message"] for p in problems) or "invalid request"
        error = ApiError(400, message, "invalid_request", problems[0]["param"] if problems else None, problems)
        return error_response(request.url.path, error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(request.url.path, ApiError(exc.status_code, str(exc.detail), None))

    @app.exception_handler(OpenRFTError)
    async def _openrft(request: Request, exc: OpenRFTError):
        return error_response(request.url.path, ApiError(400, str(exc), "invalid_request"))

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError):
        message = f"the request nests deeper than {MAX_DEPTH} levels"
        return error_response(request.url.path, ApiError(400, message, "document_too_complex"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return error_response(request.url.path, unexpected_error(exc, request.method, request.url.path))


def unexpected_error(exc: Exception, method: str | None, path: str | None) -> ApiError:
    """An error no route handled: 507 for a full disk (the database's or the data directory's: nothing
    was stored), else 500 with an error id; logged either way (the traceback under that id), never shown to
    the client."""
    if is_disk_full(exc):
        log.error("disk full on %s %s: %s", method, path, exc)
        return ApiError(507, f"{DISK_FULL_MESSAGE}: nothing was stored; try again later", "insufficient_storage")
    error_id = "err_" + uuid.uuid4().hex[:16]  # the answer names it, the log holds the traceback under it
    log.exception("unhandled error on %s %s (error id %s)", method, path, error_id)
    return ApiError(500, f"internal server error {error_id}: logged for the server's operator", "server_error")
