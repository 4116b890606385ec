#!/bin/sh
# Regenerate exporters/pprofproto/profile_pb2.py from profile.proto beside it, with protoc from
# grpcio-tools (a build-time tool only: the product needs just the protobuf runtime). The gencode
# must not be newer than the protobuf runtime pinned in pyproject.toml.
set -eu
cd "$(dirname "$0")/../exporters/pprofproto"
python="${PYTHON:-../../.venv/bin/python}"
"$python" -m pip install -q 'grpcio-tools==1.85.1'
"$python" -m grpc_tools.protoc -I. --python_out=. profile.proto
echo "regenerated $(pwd)/profile_pb2.py"
