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
}


def status_of(exc: errors.ServiceError) -> grpc.StatusCode:
    for kind in type(exc).__mro__:
        if kind in STATUS_OF:
            return STATUS_OF[kind]
    return grpc.StatusCode.INTERNAL


def translate_errors(method):
    """Decorate a servicer method (unary or streaming) so core errors abort with the right status."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def streaming(self, request, context):
            try:
                yield from method(self, request, context)
            except errors.ServiceError as exc:
                context.abort(status_of(exc), str(exc))

        return streaming

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except errors.ServiceError as exc:
            context.abort(status_of(exc), str(exc))

    return unary
