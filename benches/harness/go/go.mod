module rapidws-bench/go

go 1.26

require (
	github.com/antlabs/quickws v0.2.2
	github.com/coder/websocket v1.8.15
	github.com/gobwas/ws v1.5.0
	github.com/gorilla/websocket v1.5.3
	github.com/lesismal/nbio v1.6.12
	github.com/lxzan/gws v1.10.2
	github.com/xtaci/smux v1.5.58
)

require (
	github.com/antlabs/wsutil v0.1.11 // indirect
	github.com/gobwas/httphead v0.1.0 // indirect
	github.com/klauspost/compress v1.17.9 // indirect
	github.com/lesismal/llib v1.2.4 // indirect
	golang.org/x/crypto v0.0.0-20210513122933-cd7d49e622d5 // indirect
	golang.org/x/sys v0.0.0-20210423082822-04245dca01da // indirect
)
