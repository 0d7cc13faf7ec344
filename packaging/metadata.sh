# Sourced by scripts/package.sh: what every package's control file says besides its contents.
# Override with the environment (DEB_MAINTAINER=...) when building packages for a release.
# No Homepage field: the project names no home page (README.md, Cargo.toml).
DEB_MAINTAINER=${DEB_MAINTAINER:-shard_directory maintainers <maintainers@users.noreply.a-seed-f5fde47d.example>}
