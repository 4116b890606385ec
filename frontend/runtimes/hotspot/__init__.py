"""HotSpot JVMs read from the outside: the VM's own description of its structures (``gHotSpotVMStructs`` and
its siblings, exported by libjvm.so: the Serviceability Agent's source of truth), its code cache and the
methods behind its frames, named as Java people read them. See docs/runtimes.md."""
