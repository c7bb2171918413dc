import streamlit as st

st.title("demo_chat")
