// grpchealth asks a gRPC server's standard health service (over TLS, the
// certificate not checked: a test peer) and prints the status it answers.
//
//	grpchealth -addr HOST:PORT [-service NAME]
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func main() {
	addr := flag.String("addr", "", "the server's `HOST:PORT`")
	service := flag.String("service", "", "the service asked about")
	flag.Parse()
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reply, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
	if err != nil {
		fmt.Printf("error %s\n", status.Code(err))
		return
	}
	fmt.Println(reply.GetStatus())
}
