"""gRPC server reflection under both service names command-line tools ask for.

grpcio-reflection implements only ``grpc.reflection.v1alpha.ServerReflection``; newer tools (grpcurl,
grpc_cli, Postman) try ``grpc.reflection.v1`` first. The v1 protocol is the v1alpha one renamed (same
messages, same field numbers), so the v1 service is the same servicer registered under the v1 name,
and the v1 file descriptor (derived from v1alpha's) is added to the pool so it can describe itself.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old = f".{proto.package}."
    proto.name, proto.package = _V1_FILE, V1_PACKAGE
    for message in proto.message_type:
        for f in message.field:
            if f.HasField("type_name"):  # assigning even "" would mark a scalar field as typed
                f.type_name = f.type_name.replace(old, f".{V1_PACKAGE}.")
    for method in proto.service[0].method:
        method.input_type = method.input_type.replace(old, f".{V1_PACKAGE}.")
        method.output_type = method.output_type.replace(old, f".{V1_PACKAGE}.")
    pool.Add(proto)


def enable_reflection(service_names: list[str], server: grpc.aio.Server) -> None:
    """Reflection for ``service_names`` (plus both reflection services) under v1alpha and v1."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    names = [*service_names, reflection.SERVICE_NAME, V1_SERVICE_NAME]
    servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1_handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": v1_handler}),)
    )
