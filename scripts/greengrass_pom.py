"""The pom.xml edits of scripts/build-greengrass-nucleus, by coordinates, never by line.

    greengrass_pom.py POM version ARTIFACT VERSION     a dependency's version
    greengrass_pom.py POM replace ARTIFACT G:A:V        one dependency swapped for another
    greengrass_pom.py POM provided ARTIFACT             scope provided (not packaged)
    greengrass_pom.py POM drop-test-jars                every test-jar dependency removed

ARTIFACT matches every dependency whose artifactId holds it; none matching is exit 3,
naming the pom, so an upstream that moved on fails instead of building something else.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

NS = "http://maven.apache.org/POM/4.0.0"


def tag(name: str) -> str:
    return f"{{{NS}}}{name}"


def child(element: ET.Element, name: str) -> ET.Element:
    found = element.find(tag(name))
    return found if found is not None else ET.SubElement(element, tag(name))


def main(argv: list[str]) -> int:
    path, action, *args = argv
    ET.register_namespace("", NS)
    tree = ET.parse(path)
    if action == "drop-test-jars":
        for parent in tree.getroot().iter(tag("dependencies")):
            for dep in list(parent):
                if dep.findtext(tag("type")) == "test-jar":
                    parent.remove(dep)
        tree.write(path, xml_declaration=True, encoding="UTF-8")
        return 0
    matches = [
        dep
        for dep in tree.getroot().iter(tag("dependency"))
        if args[0] in (dep.findtext(tag("artifactId")) or "")
    ]
    if not matches:
        print(f"{path}: no dependency whose artifactId holds {args[0]!r}", file=sys.stderr)
        return 3
    for dep in matches:
        if action == "version":
            child(dep, "version").text = args[1]
        elif action == "replace":
            group, artifact, version = args[1].split(":")
            child(dep, "groupId").text = group
            child(dep, "artifactId").text = artifact
            child(dep, "version").text = version
        elif action == "provided":
            child(dep, "scope").text = "provided"
        else:
            print(f"unknown action {action!r}", file=sys.stderr)
            return 2
    tree.write(path, xml_declaration=True, encoding="UTF-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
