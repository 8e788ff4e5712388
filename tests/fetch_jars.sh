#!/usr/bin/env bash
# Copy a pom's runtime dependencies from Maven Central into a cache directory outside the checkout, and do
# it again only when the pom's content changes. The cache is shared by every checkout on the machine, so a
# fresh clone (whose pom is newer only by its file time) must neither fetch again nor delete jars that
# another checkout's tests may be running from: a new set is fetched beside the old one and renamed in.
#   usage: tests/fetch_jars.sh POM LIBS_DIR
set -euo pipefail
pom=$1
libs=$2
digest=$(sha256sum "$pom" | cut -d' ' -f1)
if [ "$(cat "$libs/.complete" 2>/dev/null)" = "$digest" ]; then
    exit 0
fi
parent=$(dirname "$libs")
mkdir -p "$parent"
fresh=$(mktemp -d "$parent/.fetching-XXXXXX")
trap 'rm -rf "$fresh"' EXIT
mvn --quiet --batch-mode -f "$pom" dependency:copy-dependencies -DoutputDirectory="$fresh" -DincludeScope=runtime
echo "$digest" > "$fresh/.complete"
if [ -d "$libs" ]; then
    replaced=$(mktemp -d "$parent/.replaced-XXXXXX")
    mv "$libs" "$replaced/"
    rm -rf "$replaced"
fi
mv "$fresh" "$libs"
