"""CIP (EtherNet/IP): class-1 datagrams (`unskit.cip.frames`) and assembly plans
(`unskit.cip.plan`), both over the Rust core."""
