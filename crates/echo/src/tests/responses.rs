//! OpenAI's Responses API: the response object and its event stream.

use super::*;

fn body(stream: bool) -> String {
    json!({"model": "gpt-echo", "input": "héllo", "instructions": "be brief", "temperature": 0.5, "stream": stream})
        .to_string()
}

#[tokio::test]
async fn a_response_echoes_what_arrived() {
    let server = start(EchoOptions::default()).await;
    let (status, headers, reply) = exchange(&client(false), post(server.addr, "/v1/responses", body(false), &[])).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(headers.contains_key("x-request-id"));
    assert!(reply["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(reply["object"], "response");
    assert_eq!(reply["status"], "completed");
    assert_eq!(reply["model"], "gpt-echo");
    assert_eq!(reply["instructions"], "be brief");
    assert_eq!(reply["temperature"], 0.5);
    assert_eq!(reply["tools"], json!([]));
    let output = reply["output"].as_array().unwrap();
    assert_eq!(output.len(), 1);
    let message = &output[0];
    assert_eq!(
        (&message["type"], &message["role"], &message["status"]),
        (&json!("message"), &json!("assistant"), &json!("completed"))
    );
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    let part = &message["content"][0];
    assert_eq!(part["type"], "output_text");
    assert_eq!(part["annotations"], json!([]));
    let text = part["text"].as_str().unwrap();
    let echoed: Value = serde_json::from_str(text).unwrap();
    assert_eq!(echoed["input"], "héllo");
    assert_eq!(echoed["instructions"], "be brief");
    assert_eq!(echoed["path"], "/v1/responses");

    let usage = &reply["usage"];
    // "be brief" + "héllo": 13 characters.
    assert_eq!(usage["input_tokens"], 4);
    assert_eq!(usage["output_tokens"], text.chars().count().div_ceil(4) as u64);
    assert_eq!(
        usage["total_tokens"],
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
}

#[tokio::test]
async fn a_streamed_response_is_openais_event_sequence() {
    let server = start(EchoOptions { chunk_delay: Duration::from_millis(10), chunks: 3, ..Default::default() }).await;
    let response = client(true).request(post(server.addr, "/responses", body(true), &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (text, error) = read_to_end(response.into_body()).await;
    assert!(error.is_none());
    let events = parse_sse(&text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (at, (name, data)) in events.iter().enumerate() {
        assert_eq!(name.as_deref(), data["type"].as_str());
        assert_eq!(data["sequence_number"], at);
    }
    let created = &events[0].1["response"];
    assert_eq!(
        (&created["status"], &created["output"], &created["usage"]),
        (&json!("in_progress"), &json!([]), &Value::Null)
    );
    let item_id = events[2].1["item"]["id"].as_str().unwrap();
    let deltas: String = events[4..7]
        .iter()
        .map(|(_, e)| {
            assert_eq!(
                (e["item_id"].as_str(), &e["output_index"], &e["content_index"]),
                (Some(item_id), &json!(0), &json!(0))
            );
            e["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(events[7].1["text"], deltas.as_str());
    let completed = &events[10].1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"][0]["content"][0]["text"], deltas.as_str());
    assert_eq!(completed["usage"]["output_tokens"], deltas.chars().count().div_ceil(4) as u64);
    let echoed: Value = serde_json::from_str(&deltas).unwrap();
    assert_eq!(echoed["path"], "/responses");
}
