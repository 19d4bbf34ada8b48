# `make deb` builds dist/egressd_<version>_amd64.deb (packaging/deb/build.sh); EGRESSD_DEB_VERSION=0.1.0-2 make deb
# gives it another Debian version.
.PHONY: deb
deb:
	bash packaging/deb/build.sh
