import streamlit as st

st.title("benchmarks")
