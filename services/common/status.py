"""Servicer side of errors: core exceptions become gRPC status codes with the core's message."""

from __future__ import annotations

import functools
import inspect
import logging

import grpc

from zerobubble.common import errors

log = logging.getLogger(__name__)

STATUS_OF: dict[type[errors.ServiceError], grpc.StatusCode] = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.TooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.TemporarilyUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Unavailable: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NotYours: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_of(exc: errors.ServiceError) -> grpc.StatusCode:
    for kind in type(exc).__mro__:
        if kind in STATUS_OF:
            return STATUS_OF[kind]
    return grpc.StatusCode.INTERNAL


def translate_errors(method):
    """Decorate a servicer method (a sync unary one, or an async unary or streaming one) so core errors
    abort with the right status."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def async_generator(self, request, context):
            try:
                async for reply in method(self, request, context):
                    yield reply
            except errors.ServiceError as exc:
                await context.abort(status_of(exc), str(exc))

        return async_generator

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def coroutine(self, request, context):
            try:
                return await method(self, request, context)
            except errors.ServiceError as exc:
                await context.abort(status_of(exc), str(exc))

        return coroutine

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except errors.ServiceError as exc:
            context.abort(status_of(exc), str(exc))

    return unary
