"""The per-query settings a client may send: an allow-list, never a deny-list.

ClickHouse has nearly 1,900 settings and each release adds more; several name
files (``output_format_schema`` writes a .proto file, and
``input_format_record_errors_file_path`` writes rejected rows, both as the
engine's user) or switch the parser (``dialect``). A deny-list misses the next
one, so only what clickhouse-connect, Grafana and the sink send, plus per-query
limits and format knobs that touch no file and no other session, are allowed.
Transport parameters (``wait_end_of_query``, ``session_id``, ``query_id``...)
never become settings (see request_params). Pure data: no engine here.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.lower().split())


SETTINGS_ALLOWED = _names(
    """
    max_execution_time timeout_overflow_mode
    max_result_rows max_result_bytes result_overflow_mode max_rows_to_read max_bytes_to_read read_overflow_mode
    max_rows_to_group_by group_by_overflow_mode max_rows_to_sort max_bytes_to_sort sort_overflow_mode
    max_rows_in_distinct max_bytes_in_distinct distinct_overflow_mode max_rows_in_join max_bytes_in_join
    join_overflow_mode max_memory_usage max_block_size max_threads max_columns_to_read max_rows_to_transfer
    max_bytes_to_transfer transfer_overflow_mode
    cancel_http_readonly_queries_on_client_close cast_string_to_dynamic_use_inference
    session_timezone date_time_input_format date_time_output_format date_time_overflow_behavior
    async_insert wait_for_async_insert insert_deduplication_token insert_deduplicate
    mutations_sync alter_sync lightweight_deletes_sync
    input_format_null_as_default input_format_skip_unknown_fields input_format_defaults_for_omitted_fields
    input_format_with_names_use_header input_format_with_types_use_header input_format_import_nested_json
    input_format_allow_errors_num input_format_allow_errors_ratio input_format_csv_empty_as_default
    input_format_tsv_empty_as_default input_format_json_read_objects_as_strings
    output_format_json_quote_64bit_integers output_format_json_quote_64bit_floats output_format_json_quote_denormals
    output_format_json_quote_decimals output_format_json_named_tuples_as_objects output_format_json_array_of_rows
    output_format_write_statistics output_format_decimal_trailing_zeros output_format_csv_crlf_end_of_line
    output_format_arrow_string_as_string output_format_arrow_low_cardinality_as_dictionary
    output_format_arrow_fixed_string_as_fixed_byte_array output_format_parquet_string_as_string
    output_format_native_encode_types_in_binary_format input_format_native_decode_types_in_binary_format
    output_format_pretty_max_rows output_format_pretty_color output_format_pretty_row_numbers
    format_csv_delimiter format_csv_allow_single_quotes format_csv_allow_double_quotes
    format_csv_null_representation format_tsv_null_representation
    extremes totals_mode join_use_nulls joined_subquery_requires_alias transform_null_in
    aggregate_functions_null_for_empty count_distinct_implementation union_default_mode final
    prefer_column_name_to_alias enable_analyzer allow_experimental_analyzer log_comment
    allow_suspicious_low_cardinality_types enable_json_type allow_experimental_json_type
    enable_time_time64_type allow_experimental_time_time64_type data_type_default_nullable flatten_nested
    optimize_move_to_prewhere optimize_read_in_order optimize_aggregation_in_order
    enable_http_compression http_zlib_compression_level
    """
)
