// Command protogen generates Go code from fleetinfer's .proto files without a
// protoc binary: github.com/bufbuild/protocompile parses and links the files,
// and the pinned protoc-gen-go and protoc-gen-go-grpc plugins (built from this
// module) turn the descriptors into code through the plugin protocol protoc
// itself uses, so the output is what protoc would write.
//
// Usage, from the repository root:
//
//	protogen -plugins DIR file.proto...
//
// DIR holds the protoc-gen-go and protoc-gen-go-grpc binaries. Files are named
// relative to the root, which is also the import path root; the generated
// files go next to them (paths=source_relative).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/pluginpb"
)

func main() {
	plugins := flag.String("plugins", "", "directory with the protoc-gen-go and protoc-gen-go-grpc binaries")
	flag.Parse()
	if *plugins == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: protogen -plugins DIR file.proto...")
		os.Exit(2)
	}
	if err := run(context.Background(), *plugins, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, pluginDir string, files []string) error {
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{"."}}),
		// Comments go into the generated code, as protoc does.
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	linked, err := compiler.Compile(ctx, files...)
	if err != nil {
		return err
	}
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: files,
		Parameter:      proto.String("paths=source_relative"),
	}
	// The request lists every file in dependency order, imports first.
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		req.ProtoFile = append(req.ProtoFile, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range linked {
		add(f)
	}
	for _, plugin := range []string{"protoc-gen-go", "protoc-gen-go-grpc"} {
		if err := runPlugin(ctx, filepath.Join(pluginDir, plugin), req); err != nil {
			return fmt.Errorf("%s: %w", plugin, err)
		}
	}
	return nil
}

func runPlugin(ctx context.Context, path string, req *pluginpb.CodeGeneratorRequest) error {
	in, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &out, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s", err, stderr.String())
	}
	var resp pluginpb.CodeGeneratorResponse
	if err := proto.Unmarshal(out.Bytes(), &resp); err != nil {
		return err
	}
	if resp.Error != nil {
		return errors.New(resp.GetError())
	}
	for _, f := range resp.File {
		if f.GetInsertionPoint() != "" {
			return fmt.Errorf("insertion points are not supported (%s)", f.GetName())
		}
		if err := os.WriteFile(f.GetName(), []byte(f.GetContent()), 0o644); err != nil {
			return err
		}
	}
	return nil
}
