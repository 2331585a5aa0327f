use super::*;

fn parser(tools: Value) -> Parser {
    let body = Body::parse(json!({"tools": tools}).to_string().as_bytes())
        .ok()
        .unwrap();
    parse(&body).ok().unwrap().parser().unwrap()
}

fn weather() -> Parser {
    parser(
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}},
        }}}]),
    )
}

fn names_and_args(calls: &[ToolCall]) -> Vec<(String, Value)> {
    calls
        .iter()
        .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap()))
        .collect()
}

#[test]
fn qwen3_json_calls_are_parsed_and_the_text_before_them_is_content() {
    let text = "Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}\n</tool_call>";
    let (content, calls) = extract(weather(), text);
    assert_eq!(content, "Let me look.\n\n\n");
    assert_eq!(
        names_and_args(&calls),
        vec![
            ("get_weather".into(), json!({"city": "Paris"})),
            ("get_weather".into(), json!({"city": "Rome"}))
        ]
    );
    assert!(calls[0].id.starts_with("call_"));
    assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
}

#[test]
fn qwen_xml_calls_take_parameter_types_from_the_schema() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n</function>\n</tool_call>";
    let (content, calls) = extract(weather(), text);
    assert_eq!(content, "");
    assert_eq!(
        names_and_args(&calls),
        vec![(
            "get_weather".into(),
            json!({"city": "New York", "days": 3, "zip": "10001"})
        )]
    );
}

#[test]
fn deepseek_v3_and_v3_1_calls_are_parsed() {
    let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Bergen\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (content, calls) = extract(weather(), v3);
    assert_eq!(content, "");
    assert_eq!(
        names_and_args(&calls),
        vec![
            ("get_weather".into(), json!({"city": "Oslo"})),
            ("get_weather".into(), json!({"city": "Bergen"}))
        ]
    );
    let v31 = "ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Lima\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (content, calls) = extract(weather(), v31);
    assert_eq!(content, "ok");
    assert_eq!(
        names_and_args(&calls),
        vec![("get_weather".into(), json!({"city": "Lima"}))]
    );
}

#[test]
fn kimi_k2_calls_keep_their_ids() {
    let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Kyoto\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Nara\"}<|tool_call_end|><|tool_calls_section_end|>";
    let (content, calls) = extract(weather(), text);
    assert_eq!(content, "");
    assert_eq!(calls[0].id, "functions.get_weather:0");
    assert_eq!(calls[1].id, "functions.get_weather:1");
    assert_eq!(
        names_and_args(&calls),
        vec![
            ("get_weather".into(), json!({"city": "Kyoto"})),
            ("get_weather".into(), json!({"city": "Nara"}))
        ]
    );
}

#[test]
fn text_that_is_not_a_valid_call_stays_content() {
    for text in [
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
        "<tool_call>not json</tool_call> after",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|><|tool_calls_section_end|>",
        "a < b and <tool_ is not a tag",
    ] {
        let (content, calls) = extract(weather(), text);
        assert_eq!((content.as_str(), calls.len()), (text, 0), "{text}");
    }
}

#[test]
fn streamed_calls_hold_back_only_what_may_be_a_call() {
    let text =
        "Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call> done";
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let mut s = ToolStream::new(Some(weather()));
    let (mut content, mut calls) = (String::new(), Vec::new());
    for c in &chars {
        let (t, found) = s.push(c);
        content.push_str(&t);
        calls.extend(found);
        if calls.is_empty() {
            assert!(!content.contains('<'), "{content}");
        }
    }
    let (t, found) = s.finish();
    content.push_str(&t);
    calls.extend(found);
    assert_eq!(content, "Sure.  done");
    assert_eq!(
        names_and_args(&calls),
        vec![("get_weather".into(), json!({"city": "Paris"}))]
    );

    // A call cut off at the end of the answer still counts when it parses.
    let mut s = ToolStream::new(Some(weather()));
    let (t, none) = s.push("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n");
    assert_eq!((t.as_str(), none.len()), ("", 0));
    assert_eq!(s.finish().1.len(), 1);
}

#[test]
fn tool_choice_none_and_parallel_tool_calls_false_are_honoured() {
    let tools = json!([
        {"type": "function", "function": {"name": "a"}},
        {"type": "function", "function": {"name": "b"}}
    ]);
    let parse_body = |extra: Value| {
        let mut v = json!({"tools": tools});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        parse(&Body::parse(v.to_string().as_bytes()).ok().unwrap())
            .ok()
            .unwrap()
    };
    let none = parse_body(json!({"tool_choice": "none"}));
    assert!(none.for_template().is_none() && none.parser().is_none());
    let named = parse_body(json!({"tool_choice": {"type": "function", "function": {"name": "b"}}}));
    assert_eq!(named.for_template().unwrap().len(), 1);
    let single = parse_body(json!({"parallel_tool_calls": false})).parser().unwrap();
    let two = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    let (_, calls) = extract(single, two);
    assert_eq!(calls.len(), 1);
    assert!(parse(
        &Body::parse(br#"{"tools": [], "tool_choice": {"type": "function", "function": {"name": "zz"}}}"#)
            .ok()
            .unwrap()
    )
    .is_err());
}

#[test]
fn request_tool_call_arguments_are_parsed_for_the_template() {
    let calls = json!([{"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{\"x\": 1}"}}]);
    let v = calls_for_template("messages[1].tool_calls", &calls).ok().unwrap();
    assert_eq!(v[0]["function"]["arguments"], json!({"x": 1}));
}

#[test]
fn streaming_costs_the_same_whatever_the_size_of_tools() {
    // 100 tools of 100 parameters each: about 900 KB of schemas.
    let properties: Map<String, Value> = (0..100)
        .map(|k| {
            (
                format!("p{k}"),
                json!({"type": "string", "description": "x".repeat(80)}),
            )
        })
        .collect();
    let schemas = (0..100)
        .map(|i| (format!("f{i}"), json!({"type": "object", "properties": properties})))
        .collect();
    let mut s = ToolStream::new(Some(Parser {
        schemas,
        parallel: true,
    }));
    let t = std::time::Instant::now();
    let mut content = String::new();
    for _ in 0..5000 {
        content.push_str(&s.push("And God said ").0);
    }
    assert_eq!(content.len(), 5000 * 13);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "5000 pieces took {:?}",
        t.elapsed()
    );
}

#[test]
fn glm_calls_are_parsed_with_newlines_or_without() {
    // GLM-4.5/4.6 put each tag on its line; GLM-4.7 writes them compact.
    for text in [
        "<think>Let me check.</think><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        "<think>Let me check.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
    ] {
        let (content, calls) = extract(weather(), text);
        assert_eq!(content, "<think>Let me check.</think>", "{text}");
        assert_eq!(
            names_and_args(&calls),
            vec![("get_weather".into(), json!({"city": "Paris", "days": 3}))],
            "{text}"
        );
    }
    // A call without arguments, and a block that is not a call.
    let (_, calls) = extract(weather(), "<tool_call>get_weather\n</tool_call>");
    assert_eq!(names_and_args(&calls), vec![("get_weather".into(), json!({}))]);
    let (content, calls) = extract(weather(), "<tool_call>not a call <b>x</b></tool_call>");
    assert!(calls.is_empty() && content.contains("not a call"), "{content}");
}

#[test]
fn minimax_m2_calls_are_parsed_several_to_a_block() {
    let text = "Checking both.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">New York</parameter>\n<parameter name=\"days\">2</parameter>\n</invoke>\n<invoke name=\"get_weather\">\n<parameter name=\"zip\">10001</parameter>\n</invoke>\n</minimax:tool_call>";
    let (content, calls) = extract(weather(), text);
    assert_eq!(content, "Checking both.\n");
    assert_eq!(
        names_and_args(&calls),
        vec![
            ("get_weather".into(), json!({"city": "New York", "days": 2})),
            ("get_weather".into(), json!({"zip": "10001"}))
        ]
    );
    // Streamed a few bytes at a time, the block is held back, then parsed.
    let mut s = ToolStream::new(Some(weather()));
    let (mut shown, mut found) = (String::new(), Vec::new());
    for piece in text.as_bytes().chunks(5) {
        let (c, f) = s.push(std::str::from_utf8(piece).unwrap());
        shown.push_str(&c);
        found.extend(f);
    }
    let (c, f) = s.finish();
    shown.push_str(&c);
    found.extend(f);
    assert_eq!(shown, "Checking both.\n");
    assert_eq!(found.len(), 2);
}
