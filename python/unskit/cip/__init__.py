"""The CIP / EtherNet-IP adapter: configuration, poll mode over pycomm3, the component."""
