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

# One OCI archive holding an index for linux/amd64 and linux/arm64 (GH200/GB200 nodes
# are arm64). Needs rustup's musl targets, musl-tools (ring's C code on amd64),
# gcc-aarch64-linux-gnu (the same on arm64) and buildah; no daemon, no emulation.
ARM := aarch64-unknown-linux-musl
image:
	rustup target add $(TARGET) $(ARM) >/dev/null 2>&1 || true
	cargo build --profile dist --target $(TARGET)
	CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc \
	  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc \
	  cargo build --profile dist --target $(ARM)
	mkdir -p target/image
	-$(BUILDAH) manifest rm card-quota:$(VERSION) >/dev/null 2>&1
	-$(BUILDAH) rmi -f card-quota:$(VERSION) >/dev/null 2>&1
	$(BUILDAH) manifest create card-quota:$(VERSION)
	for arch in amd64:$(TARGET) arm64:$(ARM); do \
	  $(BUILDAH) bud --isolation chroot --layers=false --platform linux/$${arch%%:*} \
	    --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) --build-arg TARGET=$${arch#*:} \
	    --manifest card-quota:$(VERSION) -f Containerfile . || exit 1; \
	done
	rm -f $(IMAGE)
	$(BUILDAH) manifest push --all card-quota:$(VERSION) oci-archive:$(IMAGE):$(VERSION)
	@echo "image: $(IMAGE) (tag $(VERSION), linux/amd64 and linux/arm64)"

manifests:
	cargo run --release -- manifests --cert-dir certs
