# Entry points: `make test` (what CI runs), `make image` (the container image as an OCI
# archive under target/image/), `make manifests` (install YAML for certs/ in ./certs).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
REVISION := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
TARGET := x86_64-unknown-linux-musl
IMAGE := target/image/card-quota-$(VERSION).tar
BUILDAH := buildah --storage-driver vfs

.PHONY: test image manifests

test:
	cargo test

# Needs rustup's musl target, musl-tools (ring's C code) and buildah.
image:
	rustup target add $(TARGET) >/dev/null 2>&1 || true
	cargo build --profile dist --target $(TARGET)
	mkdir -p target/image
	$(BUILDAH) bud --isolation chroot --layers=false --build-arg VERSION=$(VERSION) \
	  --build-arg REVISION=$(REVISION) -f Containerfile -t card-quota:$(VERSION) .
	rm -f $(IMAGE)
	$(BUILDAH) push card-quota:$(VERSION) oci-archive:$(IMAGE):$(VERSION)
	@echo "image: $(IMAGE) (tag $(VERSION))"

manifests:
	cargo run --release -- manifests --cert-dir certs
