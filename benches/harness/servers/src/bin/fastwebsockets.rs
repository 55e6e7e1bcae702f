//! fastwebsockets with its hyper-based upgrade, auto-pong and auto-close on,
//! and a FragmentCollector so fragmented messages are echoed whole.

use fastwebsockets::{FragmentCollector, Frame, OpCode, Payload};
use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rapidws_baselines::{Args, next_push, push_ticker};

fn main() {
    rapidws_baselines::serve(|stream, args| async move {
        let service = hyper::service::service_fn(move |request| upgrade(request, args.clone()));
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await;
    });
}

async fn upgrade(
    mut request: Request<Incoming>,
    args: Args,
) -> Result<Response<Empty<Bytes>>, fastwebsockets::WebSocketError> {
    let (response, socket) = fastwebsockets::upgrade::upgrade(&mut request)?;
    tokio::spawn(async move {
        let Ok(ws) = socket.await else { return };
        let mut ws = FragmentCollector::new(ws);
        let mut ticker = push_ticker(&args);
        let push = vec![0x5a; args.push_size];
        loop {
            tokio::select! {
                frame = ws.read_frame() => match frame {
                    Ok(frame) if matches!(frame.opcode, OpCode::Text | OpCode::Binary) => {
                        if ws.write_frame(frame).await.is_err() {
                            return;
                        }
                    }
                    Ok(frame) if frame.opcode == OpCode::Close => return,
                    Ok(_) => {}
                    Err(_) => return,
                },
                _ = next_push(&mut ticker) => {
                    let frame = Frame::binary(Payload::Borrowed(&push));
                    if ws.write_frame(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Ok(response)
}
