"""The CIP / EtherNet-IP adapter: configuration, poll mode over pycomm3, the component, and
class-1 datagrams (`unskit.cip.frames`) and assembly plans (`unskit.cip.plan`) over the
Rust core."""
