import streamlit as st

st.title("config_builder")
