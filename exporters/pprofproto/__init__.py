"""pprof's ``profile.proto``, compiled for the official ``protobuf`` runtime (pinned in pyproject.toml).

- ``profile.proto``: copied unchanged from github.com/google/pprof, ``proto/profile.proto`` at commit
  b9395ee17fa0d0013c3fd96ac9482318422ac337 (Copyright 2016 Google Inc., Apache License 2.0, whose
  header the file keeps).
- ``profile_pb2.py``: generated from it by protoc 7.35.1 (grpcio-tools 1.85.1); never edited by hand.

To regenerate (a newer proto, or a protobuf runtime that refuses this gencode)::

    scripts/regen-pprof-proto.sh
"""
