// Pins the protobuf code generators: protocompile (parser, instead of protoc),
// protoc-gen-go at the protobuf runtime version of the main module,
// and protoc-gen-go-grpc. `make generate` builds them into
// bin/protogen-<versions>/ and runs protogen.
module github.com/fleetinfer/fleetinfer/hack/tools/protogen

go 1.26.0

tool (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)

require (
	github.com/bufbuild/protocompile v0.14.1
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af
)

require (
	golang.org/x/sync v0.8.0 // indirect
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2 // indirect
)
